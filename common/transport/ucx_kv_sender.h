// The prefill worker's side of the UCX KV transport. A push takes an export
// region (host memory registered with UCX once and pooled, at least the whole
// prompt's KV), writes each sealed chunk into it as its layer finishes and
// sends only the header (P's worker address, the region's address and remote
// key), per-chunk references (layer, tokens, offset, length, XXH3) and the
// commit over the KvTransfer.Push call; the decode worker reads the bytes
// with one-sided UCX gets (ucx_kv_receiver.h). The region returns to the
// pool after D's acknowledgement (D has read everything by then); a failed
// or cancelled push's region is reused only after a quarantine, when D can
// no longer be reading it. UcxKvSender picks UCX per decode worker (its
// Describe names a UCX worker); otherwise, or when D cannot reach this
// worker (nothing reached a sink yet), the push goes to `fallback` (auto
// mode) or fails (--kv_transport=ucx). Thread-safe; streams follow
// KvPushStream's rules.
#ifndef PDSERVE_COMMON_TRANSPORT_UCX_KV_SENDER_H_
#define PDSERVE_COMMON_TRANSPORT_UCX_KV_SENDER_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_transport.h"
#include "common/transport/ucx_worker.h"

namespace pdserve::transport {

class UcxKvSender : public KvSender {
 public:
  static constexpr int kMaxPooled = 4;
  struct Options {
    // Unused pooled regions are unregistered after this long.
    absl::Duration pool_idle = absl::Seconds(10);
    // A failed or cancelled push's region is not reused before this long.
    absl::Duration quarantine = absl::Seconds(2);
  };

  // `grpc` carries the control stream; `worker` registers and serves the
  // regions; `fallback` (may be null: UCX or fail) takes the pushes UCX
  // cannot carry. All must outlive this.
  UcxKvSender(GrpcKvSender* grpc, UcxWorker* worker, KvSender* fallback,
              Options options);
  UcxKvSender(GrpcKvSender* grpc, UcxWorker* worker, KvSender* fallback)
      : UcxKvSender(grpc, worker, fallback, Options()) {}
  ~UcxKvSender() override;  // unregisters the pooled regions
  absl::StatusOr<std::unique_ptr<KvPushStream>> Open(
      const std::string& target, const pb::KvHeader& header,
      absl::Time deadline) override;

  // Whether `target` accepts UCX pushes (Describe, cached per target;
  // errors: the Describe call failed).
  absl::StatusOr<bool> UcxUsable(const std::string& target,
                                 absl::Time deadline);
  // Drops the cached answer for `target` (after a failed push).
  void Forget(const std::string& target);

  // A registered region of at least `bytes`: the smallest reusable pooled
  // one not more than twice as large (or than kRegionRound), else a new one.
  absl::StatusOr<std::unique_ptr<UcxRegion>> TakeRegion(int64_t bytes);
  // Back to the pool; `clean`: D acknowledged the push (reusable at once).
  void ReturnRegion(std::unique_ptr<UcxRegion> region, bool clean);
  int pooled_regions();
  // Regions held by pushes in flight.
  int regions_in_use() const { return in_use_.load(); }

  GrpcKvSender* grpc() const { return grpc_; }
  KvSender* fallback() const { return fallback_; }
  UcxWorker* worker() const { return worker_; }

  static constexpr int64_t kRegionRound = int64_t{2} << 20;

 private:
  static constexpr absl::Duration kNegativeTtl = absl::Seconds(60);
  struct Probed {
    bool usable = false;
    absl::Time at;
  };
  struct Pooled {
    std::unique_ptr<UcxRegion> region;
    absl::Time since;       // returned
    absl::Time not_before;  // reusable from
  };
  void ReapLoop();

  GrpcKvSender* const grpc_;
  UcxWorker* const worker_;
  KvSender* const fallback_;
  const Options options_;
  std::atomic<int> in_use_{0};
  absl::Mutex mu_;
  std::map<std::string, Probed> probed_ ABSL_GUARDED_BY(mu_);
  std::vector<Pooled> pool_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;  // unregisters regions idle for pool_idle
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_UCX_KV_SENDER_H_
