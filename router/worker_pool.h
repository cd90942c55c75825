// WorkerPool: the router's view of one pool of workers (prefill or decode).
// Targets are static "host:port" entries or "dns:///name:port" names that are
// re-resolved periodically (the Kubernetes headless-service pattern). A
// background thread health-checks every endpoint (grpc.health.v1) and polls
// its Worker.Status for routing; Pick chooses a healthy endpoint by load.
// Each endpoint's health is exported as pdserve_worker_healthy{pool,endpoint}.
// Thread-safe.
#ifndef PDSERVE_ROUTER_WORKER_POOL_H_
#define PDSERVE_ROUTER_WORKER_POOL_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/metrics/router_metrics.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "pdserve/v1/worker.grpc.pb.h"

namespace pdserve {

namespace pb = ::pdserve::v1::internal;

// One worker process. Immutable except the status fields (under mu).
struct WorkerEndpoint {
  std::string address;  // host:port as dialled (and given to P as D's target)
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Prefill::Stub> prefill;
  std::unique_ptr<pb::Decode::Stub> decode;
  std::unique_ptr<pb::Worker::Stub> worker;
  std::atomic<int> in_flight{0};  // requests this router has sent it

  mutable absl::Mutex mu;
  bool healthy ABSL_GUARDED_BY(mu) = false;
  // Health polls in a row that timed out, and when the first of them was
  // sent (a worker busy computing on few cores answers late; only late
  // answers that go on for a while mark it unhealthy).
  int consecutive_timeouts ABSL_GUARDED_BY(mu) = 0;
  absl::Time late_since ABSL_GUARDED_BY(mu);
  std::string last_error ABSL_GUARDED_BY(mu);
  pb::WorkerStatusResponse status ABSL_GUARDED_BY(mu);
};

enum class PoolKind { kPrefill, kDecode };

// Routing hint: requests with the same affinity key prefer the same endpoint
// (rendezvous hashing over the healthy endpoints, so a key moves only when
// its endpoint leaves), unless that endpoint's load exceeds the least loaded
// one's by more than max_extra_load (then the least loaded wins).
// request_tokens > 0: only endpoints whose whole KV pool holds that many
// tokens (or that have not reported its size) qualify.
struct PickHint {
  std::optional<uint64_t> affinity;
  double max_extra_load = 2.0;
  int64_t request_tokens = 0;
};

// The affinity key of a prompt for prefix-aware routing: a hash of its first
// min(max_blocks, (n - 1) / block_size) full blocks of tokens (the blocks a
// worker's prefix cache can reuse: one token is always computed); none for a
// prompt without such a block or when max_blocks <= 0.
std::optional<uint64_t> PrefixAffinityKey(absl::Span<const int32_t> prompt,
                                          int block_size, int max_blocks);

// INVALID_ARGUMENT naming --`flag` when a target is not host:port or
// dns:///name:port with a port in [1, 65535] (such a worker would only ever
// show as unhealthy).
absl::Status CheckWorkerTargets(absl::string_view flag,
                                const std::vector<std::string>& targets);

struct WorkerPoolOptions {
  PoolKind kind = PoolKind::kDecode;
  std::vector<std::string> targets;  // host:port or dns:///name:port
  std::shared_ptr<grpc::ChannelCredentials> creds;
  absl::Duration poll_interval = absl::Milliseconds(200);
  absl::Duration dns_refresh = absl::Seconds(5);
  metrics::RouterMetrics* metrics = nullptr;  // optional; must outlive the pool
};

class WorkerPool {
 public:
  explicit WorkerPool(WorkerPoolOptions options);
  ~WorkerPool();

  // A healthy endpoint not in `exclude`, least loaded first (decode: most
  // free KV blocks relative to running load; prefill: shortest queue), or
  // the hint's affine endpoint if not too loaded. UNAVAILABLE when none;
  // OUT_OF_RANGE when the only ones left (all healthy) are too small for
  // hint.request_tokens (CheckRequestFitsPool's message, for the largest).
  absl::StatusOr<std::shared_ptr<WorkerEndpoint>> Pick(
      const std::set<std::string>& exclude, const PickHint& hint = {}) const;
  // Marks an endpoint unhealthy until its next successful health check.
  void ReportFailure(const std::string& address, const std::string& error);
  std::vector<std::shared_ptr<WorkerEndpoint>> Endpoints() const;
  int healthy_count() const;
  // Requests the healthy, non-draining workers hold at once before refusing
  // (the sum of their reported request_capacity); 0 = no bound (one is
  // unbounded or not polled yet). While none is healthy (all restarting or
  // draining): the last sum seen, so that the requests admitted meanwhile,
  // which wait for a worker (--worker_wait), are no more than the pool
  // held; 0 if none was ever seen.
  int64_t RequestCapacity() const;
  // Runs one discovery + poll round now (tests, startup).
  void PollOnce();

 private:
  void Loop();
  void Resolve();
  void PollEndpoint(WorkerEndpoint& ep);
  void ExportHealth(const std::string& address, bool healthy);

  const WorkerPoolOptions options_;
  mutable absl::Mutex mu_;
  // RequestCapacity's last sum over at least one healthy worker.
  mutable std::atomic<int64_t> last_capacity_{0};
  std::map<std::string, std::shared_ptr<WorkerEndpoint>> endpoints_
      ABSL_GUARDED_BY(mu_);
  absl::Time next_resolve_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_WORKER_POOL_H_
