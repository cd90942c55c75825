// PrefillWorker: one prefill process. Prefill calls queue up; a compute thread
// runs forward passes of at most max_batch_tokens tokens: each pass takes the
// next chunk (--prefill_chunk_tokens) of every prompt in progress and admits
// queued prompts while the budget has room, so a long prompt does not hold
// back short ones. It streams each layer's KV to
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
#include <functional>
#include <map>
#include <memory>
#include <optional>
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
#include "common/transport/kv_transports.h"
#include "common/util/cost_fit.h"
#include "pdserve/v1/worker.grpc.pb.h"
#include "prefill_worker/push_pipeline.h"

namespace pdserve {

struct PrefillWorkerOptions {
  EngineOptions engine;
  int max_batch_tokens = 0;  // 0 = engine max_batch_tokens
  // Tokens of one prompt computed per forward pass at most (0 = as many as
  // the budget allows): a long prompt is prefilled in chunks of this size and
  // prompts arriving meanwhile join the next pass.
  int prefill_chunk_tokens = 0;
  // Prompts queued at most; beyond, Prefill is RESOURCE_EXHAUSTED. 0 = no
  // bound.
  int max_queue = 256;
  absl::Duration push_timeout = absl::Seconds(60);
  // Test-only: sleep this long before each batch (slow prefills for failure
  // tests). Zero = off.
  absl::Duration testonly_prefill_delay;
  // Required; must outlive the worker.
  metrics::PrefillMetrics* metrics = nullptr;
  // What the sender's UCX transport holds (Status, metrics); optional.
  std::function<transport::UcxStats()> ucx_stats;
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
  struct Item;
  PrefillWorker(const PrefillWorkerOptions& options,
                transport::KvSender* sender);
  void ComputeLoop();
  // Compute thread: sets a taken job up (sequence, prefix reuse, push);
  // nullopt when it failed (the job is answered).
  std::optional<Item> StartItem(const std::shared_ptr<Job>& job);
  // Compute thread: drops prompts whose caller cancelled.
  void DropCancelled(std::vector<Item>& active);
  // Compute thread: one forward pass over the next chunk of each active
  // prompt; answers and removes those that completed.
  void RunPass(std::vector<Item>& active);
  void FinishItem(Item& it, const absl::Status& status,
                  absl::Span<const float> last_logits);
  // Tokens of a prompt with `remaining` tokens left to compute this pass.
  int PassTokens(int remaining) const;
  void ReapPushes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Exports the KV pool occupancy (compute thread).
  void ExportKvPool();
  // Chunks of a layer sealed together at most (and so held before the push
  // takes them): 8 (32 MiB).
  static constexpr size_t kExportGroupChunks = 8;
  // Tokens [begin, end) of a sequence's layer, bound for `push`.
  struct KvExportRange {
    SeqId seq = 0;
    int begin = 0;
    int end = 0;
    PushPipeline* push = nullptr;
  };
  // Exports `ranges` of `layer` as sealed chunks into their pushes, in order
  // per push. A layer cut into several chunks (several prompts in the pass,
  // or a long chunk of one) has them sealed by all the compute threads at
  // once, which would otherwise wait for this one; no chunk is cut for that
  // (each costs the push and the decode worker a fixed 0.1-0.2 ms or more:
  // DESIGN.md).
  // A push whose export fails is cancelled. Compute thread; adds its wall
  // time to pass_export_seconds_.
  void ExportLayerChunks(int layer, absl::Span<const KvExportRange> ranges);

  const PrefillWorkerOptions options_;
  transport::KvSender* const sender_;
  std::unique_ptr<Engine> engine_;  // driven by the compute thread only
  int max_batch_tokens_ = 0;
  int chunk_tokens_ = 0;
  // A layer's chunks are sealed by all compute threads at once (off with
  // PDSERVE_KV_EXPORT_PARALLEL=0, for A/B runs).
  bool parallel_export_ = true;
  double pass_export_seconds_ = 0;  // compute thread
  std::string fingerprint_;
  KvLayout layout_;

  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<int64_t> prefill_tokens_{0};
  // Prompt tokens accepted and not yet answered; prefill seconds against
  // computed tokens (reported for the router's --mode=auto policy).
  std::atomic<int64_t> queued_tokens_{0};
  CostFit prefill_cost_;
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
