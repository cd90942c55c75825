// PushPipeline: one sequence's KV push from a prefill worker, decoupled from
// the compute thread. The compute thread enqueues sealed chunks as each layer
// finishes (Enqueue never waits on the network, only on a byte bound); the
// pipeline's own thread opens the stream to the decode worker and sends them,
// then the commit. Thread-safe: Enqueue/Commit from the compute thread,
// Cancel from any thread.
#ifndef PDSERVE_PREFILL_WORKER_PUSH_PIPELINE_H_
#define PDSERVE_PREFILL_WORKER_PUSH_PIPELINE_H_

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/worker_metrics.h"
#include "common/transport/kv_transport.h"

namespace pdserve {

namespace pb = ::pdserve::v1::internal;

// Counters shared by every pipeline of a worker, and the worker's metrics
// (pushed bytes, push seconds and bandwidth, failures by reason).
struct PushCounters {
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> ok{0};
  std::atomic<int64_t> failed{0};
  metrics::PrefillMetrics* metrics = nullptr;  // optional
};

class PushPipeline {
 public:
  // Bytes queued before Enqueue waits for the network.
  static constexpr int64_t kMaxQueuedBytes = int64_t{256} << 20;

  PushPipeline(transport::KvSender* sender, std::string target,
               pb::KvHeader header, absl::Time deadline,
               PushCounters* counters);
  ~PushPipeline();  // cancels if unfinished, joins

  // Memory to export a chunk of `bytes` into (the sender's: registered
  // memory UCX sends in place, or a string); any thread.
  std::unique_ptr<transport::KvChunkBuffer> NewChunkBuffer(int64_t bytes) {
    return sender_->NewChunkBuffer(target_, bytes);
  }
  // `chunk`, sealed; its bytes in chunk.data(), or in `bytes` (from
  // NewChunkBuffer) with chunk.data() empty.
  void Enqueue(pb::KvChunk chunk,
               std::unique_ptr<transport::KvChunkBuffer> bytes = nullptr);
  void Commit(pb::KvCommit commit);
  // Aborts the push (the decode worker frees what it reserved); counted as a
  // failed push (reason: the status the push ended with).
  void Cancel();
  // Cancel() for a push that is not needed (the request ended at its first
  // token): not a failure.
  void Discard();
  bool done() const;

 private:
  void Run();

  transport::KvSender* const sender_;
  const std::string target_;
  const pb::KvHeader header_;
  const absl::Time deadline_;
  PushCounters* const counters_;

  mutable absl::Mutex mu_;
  struct Queued {
    pb::KvChunk chunk;
    std::unique_ptr<transport::KvChunkBuffer> bytes;  // or in chunk.data()
    int64_t size() const {
      return bytes != nullptr ? bytes->size()
                              : static_cast<int64_t>(chunk.data().size());
    }
  };
  std::deque<Queued> chunks_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<pb::KvCommit> commit_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool discarded_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<transport::KvPushStream> stream_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_PREFILL_WORKER_PUSH_PIPELINE_H_
