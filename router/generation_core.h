// GenerationCore: the router's request pipeline behind every front door (the
// gRPC Generation service and the OpenAI-compatible HTTP API). It validates
// and tokenizes a request (ResolveRequest), admits it (at most
// --max_in_flight running; beyond, a bounded FIFO where a request waits up to
// --admission_timeout, never past its deadline), runs it as a RequestRun and
// records its metrics. Fronts translate their protocol into a
// GenerateRequest and a ResponseSink; nothing else differs between them.
// Thread-safe.
#ifndef PDSERVE_ROUTER_GENERATION_CORE_H_
#define PDSERVE_ROUTER_GENERATION_CORE_H_

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/router_metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/cost_fit.h"
#include "pdserve/v1/generate.pb.h"
#include "router/request_builder.h"
#include "router/request_run.h"
#include "router/response_sink.h"
#include "router/router_options.h"
#include "router/timer_queue.h"
#include "router/worker_pool.h"

namespace pdserve {

// The stages set in a request's final timings (proto field names are the
// stage names of common/metrics/stage_timings.h; e2e is not a stage).
metrics::StageTimings StageTimingsFromProto(
    const pdserve::v1::StageTimings& timings);

// A started request, as its front sees it: Cancel when the client goes away.
// Thread-safe.
class RequestHandle {
 public:
  // Stops the request (waiting or running); its sink's Finish follows with
  // CANCELLED unless it already ended. Idempotent.
  void Cancel();

 private:
  friend class GenerationCore;
  absl::Mutex mu_;
  std::shared_ptr<RequestRun> run_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Set while the request waits for admission (the core's queue owns it).
  class GenerationCore* waiting_in_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class GenerationCore {
 public:
  // `tokenizer` may be null (token-id input only). `chat_templates`: the
  // model's chat templates, or the status chat requests are refused with.
  // Pools and `metrics` must outlive this.
  GenerationCore(RouterOptions options, RouterModelInfo model,
                 std::unique_ptr<Tokenizer> tokenizer,
                 absl::StatusOr<ModelChatTemplates> chat_templates,
                 WorkerPool* prefill, WorkerPool* decode,
                 metrics::RouterMetrics* metrics);
  ~GenerationCore();

  // Starts `request`. The sink receives its messages and exactly one Finish,
  // possibly before this returns (invalid request, overload). `deadline`:
  // the client's (absl::InfiniteFuture() for none).
  std::shared_ptr<RequestHandle> Generate(
      const pdserve::v1::GenerateRequest& request, absl::Time deadline,
      std::shared_ptr<ResponseSink> sink);

  absl::StatusOr<pdserve::v1::TokenizeResponse> Tokenize(
      const pdserve::v1::TokenizeRequest& request) const;
  pdserve::v1::GetModelInfoResponse ModelInfo() const;

  // New requests get UNAVAILABLE from now on.
  void StartDraining() { draining_.store(true); }
  // Ends every running request with `why` (its workers stop and free its
  // KV): for the drain timeout, so that each client gets a status rather
  // than a cut connection.
  void StopRunning(const absl::Status& why);
  // Requests running or waiting for admission.
  int in_flight() const;

  const RouterOptions& options() const { return options_; }
  const RouterModelInfo& model() const { return model_; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }

 private:
  friend class RequestHandle;
  struct Waiting {
    std::shared_ptr<RequestHandle> handle;
    std::shared_ptr<RequestRun> run;  // not started
    std::shared_ptr<ResponseSink> sink;
    absl::Time arrival;
    absl::Time give_up;           // admission timeout or the request's deadline
    bool deadline_first = false;  // give_up is the request's own deadline
  };
  // Ends a request that never ran (invalid, overloaded, cancelled while
  // waiting): sink Finish + metrics.
  void EndUnrun(ResponseSink& sink, absl::Time arrival, const RequestEnd& end);
  // After EndUnrun of a request that waited: its handle lets go of the run,
  // which holds the sink (a sink may own the handle: an HTTP job's).
  static void DetachRun(RequestHandle& handle);
  void OnRunEnd(const RequestEnd& end, const ClientStream& stream,
                absl::Time arrival, const std::string& worker_key);
  // Starts `run` for `handle` (counted as running already) unless cancelled.
  void Launch(const std::shared_ptr<RequestHandle>& handle,
              const std::shared_ptr<RequestRun>& run);
  // Removes a waiting request (its client cancelled); false if not waiting.
  bool CancelWaiting(RequestHandle* handle);
  void AdmissionTimerLoop();
  // Requests to run at once (0 = unbounded): --max_in_flight, lowered to
  // the request capacity of the healthy decode (and, unless colocated,
  // prefill) workers, so that the router holds the excess in its own queue
  // instead of sending work a worker would refuse. Exported as a gauge.
  int64_t AdmissionLimit() const;
  // Pops the waiting requests that fit under `limit`, counted as running;
  // the caller launches them outside mu_.
  std::vector<Waiting> TakeAdmittedLocked(int64_t limit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RouterOptions options_;
  const RouterModelInfo model_;
  const std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ModelChatTemplates> chat_templates_;
  ChatSupport chat_;
  WorkerPool* const prefill_;
  WorkerPool* const decode_;
  metrics::RouterMetrics* const metrics_;
  Ewma handoff_seconds_;  // see DisaggregationInputs::handoff_seconds
  PipelineEnv env_;
  std::atomic<bool> draining_{false};
  // Names this router process's requests to the workers: a random 64-bit
  // value (hex) drawn at start, so that no two routers' keys collide.
  const std::string instance_id_;
  std::atomic<uint64_t> next_id_{1};

  mutable absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  // The launched runs that have not ended, by worker key (for StopRunning).
  absl::flat_hash_map<std::string, std::weak_ptr<RequestRun>> launched_
      ABSL_GUARDED_BY(mu_);
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread admission_timer_;
  // Wakes runs waiting for a worker (--worker_wait). Last, so destroyed
  // first: its pending wake-ups run (and end their runs) while the rest of
  // the core still exists.
  TimerQueue run_timers_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_GENERATION_CORE_H_
