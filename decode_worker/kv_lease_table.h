// KvLeaseTable: the decode worker's sequences in flight between a KV push and
// their admission into the decode batch. It is the KvSinkFactory behind
// KvTransfer.Push (reserving blocks when a push begins, importing chunks,
// completing on commit) and serves the router's claim (Decode). Every entry
// holds a lease: a push that stalls, or complete KV that nobody claims, is
// freed when the lease expires. Counts received bytes, lease expiries and
// checksum failures in DecodeMetrics. Thread-safe.
#ifndef PDSERVE_DECODE_WORKER_KV_LEASE_TABLE_H_
#define PDSERVE_DECODE_WORKER_KV_LEASE_TABLE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/scheduler.h"
#include "common/metrics/worker_metrics.h"
#include "common/transport/kv_transport.h"

namespace pdserve {

namespace pb = ::pdserve::v1::internal;

// A sequence whose KV is complete and verified, handed to the claimer.
struct ReadySequence {
  pb::SequenceSpec spec;
  SeqId seq = -1;  // the caller owns it (give it to the scheduler or free it)
  pdserve::v1::GeneratedToken first_token;
  double kv_transfer_seconds = 0;  // first push message -> commit verified
  absl::Time kv_complete;          // when the commit was verified
  double prefill_queue_seconds = 0;
  double prefill_compute_seconds = 0;
};

class KvLeaseTable : public transport::KvSinkFactory {
 public:
  // `scheduler` drives `engine`; both and `metrics` must outlive the table.
  KvLeaseTable(GenerationScheduler* scheduler, const Engine* engine,
               absl::Duration lease, metrics::DecodeMetrics* metrics);
  ~KvLeaseTable() override;  // frees every sequence still held

  absl::StatusOr<std::unique_ptr<transport::KvSink>> Begin(
      const pb::KvHeader& header, std::function<void()> cancel) override;
  void Refused(const pb::KvHeader& header, const absl::Status& status) override;
  const std::string& fingerprint() const override { return fingerprint_; }
  KvLayout layout() const override { return layout_; }

  // Waits until the request's KV is complete (OK: ownership of the sequence
  // passes to the caller), its push failed (that status), the lease expired
  // (UNAVAILABLE) or is_cancelled() (CANCELLED, everything freed).
  absl::StatusOr<ReadySequence> Claim(
      const std::string& request_id, const std::function<bool()>& is_cancelled);
  // Cancels a push / frees complete KV of `request_id`. True when found.
  bool Abort(const std::string& request_id);

  int pending() const;
  int64_t lease_expiries() const { return lease_expiries_.load(); }

 private:
  class Sink;
  enum class State { kAwaitingPush, kReceiving, kComplete, kFailed };
  struct Entry {
    State state = State::kAwaitingPush;
    absl::Status status;
    SeqId seq = -1;
    uint64_t generation = 0;  // which push owns `seq`
    ReadySequence ready;
    bool claimed = false;
    absl::Time deadline;
    std::function<void()> cancel_push;
    int64_t bytes = 0;               // KV payload imported so far
    const char* transport = "grpc";  // KvHeaderTransport of the push
    // Signalled when the state becomes kComplete or kFailed. The claimer
    // waits on its entry's own: waiters on mu_ with a Condition each would
    // make every unlock of mu_ test every waiting claim.
    absl::CondVar settled;
  };

  // Marks the entry failed and returns the sequence to free (or -1); the
  // caller frees it outside mu_ with FreeSequence.
  SeqId FailLocked(Entry& e, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSequence(SeqId seq);
  void ReaperLoop();

  // Sink callbacks. ImportChunk sets `xxh3` (optional) to the chunk's
  // KvChecksum, hashed during the import.
  absl::Status ImportChunk(const std::string& id, uint64_t generation,
                           const transport::KvChunkView& chunk, uint64_t* xxh3);
  absl::Status CommitPush(const std::string& id, uint64_t generation,
                          const pb::KvCommit& commit, double seconds);
  void AbortPush(const std::string& id, uint64_t generation,
                 const absl::Status& status);

  GenerationScheduler* const scheduler_;
  const std::string fingerprint_;
  const KvLayout layout_;
  const absl::Duration lease_;
  metrics::DecodeMetrics* const metrics_;

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> lease_expiries_{0};
  std::thread reaper_;
};

}  // namespace pdserve

#endif  // PDSERVE_DECODE_WORKER_KV_LEASE_TABLE_H_
