// Same-host KV transport: P writes the KV bytes into one POSIX shared-memory
// segment per push (at least the whole prompt's KV, taken at Open, so chunks
// are written and announced layer by layer while later layers compute) and
// sends only the header, per-chunk descriptors (layer, tokens, offset,
// length, XXH3) and the commit over the KvTransfer.Push call; D maps the
// segment read-only and verifies and sinks each chunk exactly like an inline
// gRPC chunk (KvTransferService). P owns the segments: after a successful
// push the segment goes back to a small pool (creating and faulting in a
// fresh segment costs about as much as the copy itself; see
// docs/performance.md), idle ones are unlinked after kPoolIdle, a failed or
// cancelled push's at once. ShmKvSender picks the transport per
// decode worker: shared memory when the worker's probe segment (Describe)
// opens here and holds the advertised nonce, gRPC otherwise; a push whose
// segment D cannot open is retried over gRPC (nothing reached a sink yet).
// ShmKvSender is thread-safe; streams follow KvPushStream's rules.
#ifndef PDSERVE_COMMON_TRANSPORT_SHM_KV_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_SHM_KV_TRANSPORT_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_transport.h"
#include "common/transport/kv_transport_mode.h"
#include "common/transport/shm_segment.h"

namespace pdserve::transport {

// D: maps a push's segment read-only for the push. INVALID_ARGUMENT when
// the header's size is below `expected_bytes`; other errors mean this
// process cannot open the segment.
absl::StatusOr<std::unique_ptr<KvChunkSource>> OpenShmChunkSource(
    const pb::KvShmSegment& shm, int64_t expected_bytes);
// D: the chunk a descriptor points at, bytes in the segment's mapping
// (INVALID_ARGUMENT when it leaves the segment). Verification is
// KvCoverage's, as for inline chunks.
absl::StatusOr<KvChunkView> ChunkFromShm(const ShmSegment& segment,
                                         const pb::KvChunkRef& desc);

class ShmKvSender : public KvSender {
 public:
  // `grpc` carries the control stream and the fallback; must outlive this.
  // Unless grpc-only, sweeps stale segments (SweepStaleShmSegments) now and
  // every kSweepEvery.
  ShmKvSender(GrpcKvSender* grpc, KvTransportMode mode);
  ~ShmKvSender() override;  // unlinks the pooled segments
  absl::StatusOr<std::unique_ptr<KvPushStream>> Open(
      const std::string& target, const pb::KvHeader& header,
      absl::Time deadline) override;

  // Whether pushes to `target` can use shared memory (Describe + probe,
  // cached per target; errors: the Describe call failed).
  absl::StatusOr<bool> ShmUsable(const std::string& target,
                                 absl::Time deadline);
  // Drops the cached answer for `target` (after a failed push).
  void Forget(const std::string& target);
  GrpcKvSender* grpc() const { return grpc_; }
  KvTransportMode mode() const { return mode_; }

  // A segment of at least `bytes`: the smallest pooled one that is not more
  // than twice as large (or than 2 MiB), else a new one (size rounded up to
  // kSegmentRound).
  absl::StatusOr<std::unique_ptr<ShmSegment>> TakeSegment(int64_t bytes);
  // Back to the pool after a successful push (dropped when the pool is full
  // or the segment was unlinked).
  void ReturnSegment(std::unique_ptr<ShmSegment> segment);
  int pooled_segments();

  static constexpr int kMaxPooled = 2;
  static constexpr int64_t kSegmentRound = int64_t{2} << 20;
  static constexpr absl::Duration kPoolIdle = absl::Seconds(2);
  // How often (and above which age) stale segments of dead processes are
  // swept while this sender lives.
  static constexpr absl::Duration kSweepEvery = absl::Seconds(10);

 private:
  // Negative answers are re-checked after this long.
  static constexpr absl::Duration kNegativeTtl = absl::Seconds(60);
  struct Probed {
    bool usable = false;
    absl::Time at;
  };

  GrpcKvSender* const grpc_;
  const KvTransportMode mode_;
  struct Pooled {
    std::unique_ptr<ShmSegment> segment;
    absl::Time since;
  };
  void ReapLoop();

  absl::Mutex mu_;
  std::map<std::string, Probed> probed_ ABSL_GUARDED_BY(mu_);
  std::vector<Pooled> pool_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Unlinks pooled segments idle for kPoolIdle; sweeps every kSweepEvery.
  std::thread reaper_;
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_SHM_KV_TRANSPORT_H_
