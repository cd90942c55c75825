// The decode worker's side of the UCX KV transport: for a push whose header
// names a UCX tag prefix (pb::KvUcxSource), UcxKvReceiver returns a
// KvChunkSource that receives each referenced chunk's tagged message (sent
// by P from its registered export buffer or ring) into one of two landing
// buffers registered once and reused (UcxLandingPool; taken at a push's
// first such message; the next chunk's receive is posted into the other
// before this chunk is handed out), or, for a chunk P left in place (same host,
// after Describe's probe), maps P's export buffer (cached per P worker and key)
// and hands out the bytes where they are. The bytes are then verified and
// imported by KvTransferService exactly like inline gRPC chunks. What P sent
// for a push that failed here is received and discarded for a while (UCX cannot
// cancel P's sends). Thread-safe; a source is driven by one push's handler
// thread.
#ifndef PDSERVE_COMMON_TRANSPORT_UCX_KV_RECEIVER_H_
#define PDSERVE_COMMON_TRANSPORT_UCX_KV_RECEIVER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/kv_transport.h"
#include "common/transport/ucx_worker.h"

namespace pdserve::transport {

// Landing buffers in power-of-two size classes (4 KiB up to
// `max_buffer_bytes`), registered when first needed and reused: a push takes
// one of the class its largest chunk needs, so a short prompt's push does not
// hold (and register) a target-sized buffer. Unused buffers stay registered
// up to kMaxIdleBytes in all. Thread-safe.
class UcxLandingPool {
 public:
  static constexpr int64_t kMaxIdleBytes = int64_t{32} << 20;
  static constexpr int64_t kMinBufferBytes = int64_t{4} << 10;
  UcxLandingPool(UcxWorker* worker, int64_t max_buffer_bytes)
      : worker_(worker), max_buffer_bytes_(max_buffer_bytes) {}
  int64_t max_buffer_bytes() const { return max_buffer_bytes_; }
  // A buffer of at least `bytes` (at most max_buffer_bytes).
  absl::StatusOr<std::unique_ptr<UcxRegion>> Take(int64_t bytes);
  void Return(std::unique_ptr<UcxRegion> buffer);
  // A taken buffer that will not come back.
  void Forget();
  int in_use() const;

 private:
  int64_t SizeClass(int64_t bytes) const;

  UcxWorker* const worker_;
  const int64_t max_buffer_bytes_;
  mutable absl::Mutex mu_;
  std::map<int64_t, std::vector<std::unique_ptr<UcxRegion>>> idle_
      ABSL_GUARDED_BY(mu_);
  int64_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

class UcxKvReceiver {
 public:
  // `worker` must outlive this. Chunks are at most `max_chunk_bytes` (see
  // ChunkTokenRanges: the larger of kKvChunkTargetBytes and one token of
  // one layer).
  UcxKvReceiver(UcxWorker* worker, int64_t max_chunk_bytes);

  // What Describe advertises: the worker address, host id, transports,
  // and whether this worker can map the memory of `request`'s probe (a
  // prefill worker on this host: chunks may then stay in place).
  void Describe(const pb::KvDescribeRequest& request,
                pb::KvDescribeResponse* response);

  // A prefill worker's export buffer mapped here (KvChunkRef.ucx_rkey),
  // cached per worker and key (P pools its buffers): mapping is a system
  // call and the first touch of each page a fault.
  absl::StatusOr<std::shared_ptr<UcxRemoteMemory>> MapPeerBuffer(
      const std::string& peer_address, const std::string& packed_rkey);
  // Drops the mappings of `peer_address`'s buffers (a push from it failed:
  // it may be gone) and closes the endpoint to it once unused.
  void ForgetPeer(const std::string& peer_address);
  // How many are mapped; drops the idle ones first (called on every
  // WorkerStatus, which the router polls: a dead P's memory is not held
  // for long even when no push comes).
  int mapped_buffers();
  // Mappings unused this long are dropped (at the next MapPeerBuffer or
  // mapped_buffers).
  static constexpr absl::Duration kMappingIdle = absl::Seconds(30);
  // At most this many mappings (P pools at most 128 MiB of buffers, in a
  // few sizes; a mapping of a buffer P freed keeps its memory until dropped).
  static constexpr int kMaxMappings = 128;

  // The chunks of a push; INVALID_ARGUMENT for a malformed source.
  absl::StatusOr<std::unique_ptr<KvChunkSource>> Open(
      const pb::KvHeader& header);
  // A push refused or failed before (or without) a source: P's messages
  // for it are received and discarded for kDrainFor.
  void Abandon(const pb::KvUcxSource& source);

  // Tags: the push's prefix | the chunk's index (low kChunkBits bits).
  static constexpr int kChunkBits = 24;
  static constexpr uint64_t kChunkMask = (uint64_t{1} << kChunkBits) - 1;
  // How long P's messages of a failed push are discarded.
  static constexpr absl::Duration kDrainFor = absl::Seconds(120);

  UcxWorker* worker() const { return worker_; }
  // Pushes open now (sources not yet destroyed).
  int active() const { return open_sources_.load(); }
  // Landing buffers taken by open pushes (a push whose chunks all stay in
  // place takes none).
  int landing_buffers_in_use() const { return landing_.in_use(); }

 private:
  struct Mapping {
    std::shared_ptr<UcxRemoteMemory> memory;
    absl::Time used;
  };
  // Moves the mappings unused for kMappingIdle into `drop` (released by the
  // caller after unlocking).
  void DropIdleLocked(absl::Time now,
                      std::vector<std::shared_ptr<UcxRemoteMemory>>* drop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  UcxWorker* const worker_;
  UcxLandingPool landing_;
  std::atomic<int> open_sources_{0};
  absl::Mutex mu_;
  // By (P's worker address, packed key).
  std::map<std::pair<std::string, std::string>, Mapping> mappings_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_UCX_KV_RECEIVER_H_
