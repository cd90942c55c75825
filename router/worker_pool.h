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
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
  std::string last_error ABSL_GUARDED_BY(mu);
  pb::WorkerStatusResponse status ABSL_GUARDED_BY(mu);
};

enum class PoolKind { kPrefill, kDecode };

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
  // free KV blocks relative to running load; prefill: shortest queue).
  // UNAVAILABLE when none.
  absl::StatusOr<std::shared_ptr<WorkerEndpoint>> Pick(
      const std::set<std::string>& exclude) const;
  // Marks an endpoint unhealthy until its next successful health check.
  void ReportFailure(const std::string& address, const std::string& error);
  std::vector<std::shared_ptr<WorkerEndpoint>> Endpoints() const;
  int healthy_count() const;
  // Runs one discovery + poll round now (tests, startup).
  void PollOnce();

 private:
  void Loop();
  void Resolve();
  void PollEndpoint(WorkerEndpoint& ep);
  void ExportHealth(const std::string& address, bool healthy);

  const WorkerPoolOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<WorkerEndpoint>> endpoints_
      ABSL_GUARDED_BY(mu_);
  absl::Time next_resolve_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_WORKER_POOL_H_
