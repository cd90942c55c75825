// PrefillWorker: one prefill process. Prefill calls queue up; a compute thread
// takes every queued prompt that fits the token budget, runs them through the
// Engine in one Forward (long prompts in chunks), streams each layer's KV to
// the decode worker chosen by the router while later layers compute, samples
// the first token with the request's sampler (position = prompt length, so
// the decode worker continues the same random stream) and answers the router
// at once; the push finishes in the background. Exports PrefillMetrics
// (queue depth, batches, compute, KV pool, pushes). Prompts sharing a prefix
// with earlier ones reuse their cached KV blocks (only the rest is computed;
// the reused KV is pushed too). Thread-safe.
#ifndef PDSERVE_PREFILL_WORKER_PREFILL_WORKER_H_
#define PDSERVE_PREFILL_WORKER_PREFILL_WORKER_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "common/metrics/worker_metrics.h"
#include "common/transport/kv_transport.h"
#include "pdserve/v1/worker.grpc.pb.h"
#include "prefill_worker/push_pipeline.h"

namespace pdserve {

struct PrefillWorkerOptions {
  EngineOptions engine;
  int max_batch_tokens = 0;  // 0 = engine max_batch_tokens
  // Prompts queued at most; beyond, Prefill is RESOURCE_EXHAUSTED. 0 = no
  // bound.
  int max_queue = 256;
  absl::Duration push_timeout = absl::Seconds(60);
  // Test-only: sleep this long before each batch (slow prefills for failure
  // tests). Zero = off.
  absl::Duration testonly_prefill_delay;
  // Required; must outlive the worker.
  metrics::PrefillMetrics* metrics = nullptr;
};

class PrefillWorker final : public pb::Prefill::Service,
                            public pb::Worker::Service {
 public:
  // `sender` pushes the KV (must outlive the worker).
  static absl::StatusOr<std::unique_ptr<PrefillWorker>> Create(
      const PrefillWorkerOptions& options, transport::KvSender* sender);
  ~PrefillWorker() override;

  std::vector<grpc::Service*> services();
  void StartDraining() { draining_.store(true); }
  // Prefill calls in flight plus pushes still running.
  int active_work() const;

  grpc::Status Prefill(grpc::ServerContext* context,
                       const pb::PrefillRequest* request,
                       pb::PrefillResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context,
                      const pb::WorkerStatusRequest* request,
                      pb::WorkerStatusResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context,
                     const pb::AbortRequest* request,
                     pb::AbortResponse* response) override;

 private:
  struct Job;
  PrefillWorker(const PrefillWorkerOptions& options,
                transport::KvSender* sender);
  void ComputeLoop();
  void RunBatch(std::vector<std::shared_ptr<Job>>& batch);
  void ReapPushes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Exports the KV pool occupancy (compute thread).
  void ExportKvPool();
  // Exports tokens [begin, end) of `layer` of `seq` as sealed chunks into
  // `push` (cancels the push on failure). Compute thread.
  void EnqueueKvChunks(SeqId seq, int layer, int begin, int end,
                       PushPipeline* push);

  const PrefillWorkerOptions options_;
  transport::KvSender* const sender_;
  std::unique_ptr<Engine> engine_;  // driven by the compute thread only
  int max_batch_tokens_ = 0;
  std::string fingerprint_;
  KvLayout layout_;

  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<int64_t> prefill_tokens_{0};
  std::atomic<int64_t> prefix_hit_tokens_{0};
  std::atomic<int64_t> rejected_{0};  // refused: queue full
  std::atomic<int64_t> prefix_cached_blocks_{0};
  std::atomic<int64_t> completed_{0};
  std::atomic<int64_t> cancelled_{0};
  std::atomic<int64_t> free_blocks_{0};
  std::atomic<int64_t> total_blocks_{0};
  PushCounters push_counters_;

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<PushPipeline>> pushes_
      ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread compute_;
};

}  // namespace pdserve

#endif  // PDSERVE_PREFILL_WORKER_PREFILL_WORKER_H_
