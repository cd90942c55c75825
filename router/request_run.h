// RequestRun: one admitted request's way through the workers, asynchronously
// (gRPC's callback API: no thread waits on a request). It picks a decode
// worker D and, unless prefilling on D, a prefill worker P; runs Prefill on
// P, then claims the sequence on D and streams its tokens to the client
// through ClientStream; retries another worker on UNAVAILABLE or
// RESOURCE_EXHAUSTED while nothing reached the client, migrates a stream
// whose D failed mid-stream (prompt + tokens sent so far, on another pair),
// and stops both workers at once when the client goes away, its deadline
// passes or a stop string ends the text. Every event (RPC completions,
// Cancel) runs on the run's SerialQueue, so its state needs no lock.
// Thread-safe (Start once, Cancel from any thread).
#ifndef PDSERVE_ROUTER_REQUEST_RUN_H_
#define PDSERVE_ROUTER_REQUEST_RUN_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/router_metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/cost_fit.h"
#include "router/client_stream.h"
#include "router/request_builder.h"
#include "router/response_sink.h"
#include "router/router_options.h"
#include "router/serial_queue.h"
#include "router/timer_queue.h"
#include "router/worker_pool.h"

namespace pdserve {

// What every run shares; owned by the GenerationCore, outlives its runs.
struct PipelineEnv {
  const RouterOptions* options = nullptr;
  const Tokenizer* tokenizer = nullptr;  // may be null (token ids only)
  WorkerPool* prefill = nullptr;
  WorkerPool* decode = nullptr;
  metrics::RouterMetrics* metrics = nullptr;
  // The P -> D handoff's exposed time (--mode=auto's estimate).
  Ewma* handoff_seconds = nullptr;
  // Wakes runs waiting for a worker (--worker_wait); null: they never wait.
  TimerQueue* timers = nullptr;
};

class RequestRun : public std::enable_shared_from_this<RequestRun> {
 public:
  // `on_end` runs once, just before sink->Finish, with the request's outcome
  // (the core's bookkeeping: metrics, in-flight count, admission), so the
  // metrics count a request before its client sees it end.
  using EndCallback =
      std::function<void(const RequestEnd& end, const ClientStream& stream)>;
  // `request_id` is the client's (echoed back, not necessarily unique);
  // `worker_key` names the request to the workers and must be unique among
  // every router's requests (GenerationCore::Generate makes it): workers
  // key prefill jobs and KV leases by it.
  static std::shared_ptr<RequestRun> Create(
      const PipelineEnv& env, std::string request_id, std::string worker_key,
      ResolvedRequest request, absl::Time arrival, absl::Time deadline,
      std::shared_ptr<ResponseSink> sink, EndCallback on_end);

  // Begins the first attempt.
  void Start();
  // The client went away: stops the workers and ends the run with CANCELLED
  // (unless it already ended). Any thread, any number of times.
  void Cancel() { CancelWith(absl::CancelledError("client cancelled")); }
  // As Cancel, ending the run with `why` instead (the router stops: the
  // client should retry elsewhere). The first call's status wins.
  void CancelWith(absl::Status why);
  // Unique among every router's requests (see Create).
  const std::string& worker_key() const { return worker_key_; }

  // Use Create.
  RequestRun(const PipelineEnv& env, std::string request_id,
             std::string worker_key, ResolvedRequest request,
             absl::Time arrival, absl::Time deadline,
             std::shared_ptr<ResponseSink> sink, EndCallback on_end);
  ~RequestRun();

 private:
  struct Attempt;
  struct PrefillCall;
  class DecodeCall;

  // All of these run on queue_.
  void StartAttempt();
  // Workers of one pool this run no longer picks: every one an attempt
  // failed on, and of those the ones that failed UNAVAILABLE and the ones
  // whose whole KV pool is too small for the request (OUT_OF_RANGE).
  struct Exclusions {
    std::set<std::string> workers;
    std::set<std::string> unavailable;
    std::set<std::string> too_small;
  };
  // The status a run ends with when no worker is left to try (`why`): the
  // latest failure if a refusal for load (RESOURCE_EXHAUSTED: a retry may
  // fit) or for size (OUT_OF_RANGE: no retry will; but an earlier refusal
  // for load wins), else `why`.
  absl::Status NoWorkerLeft(const absl::Status& why) const;
  // No worker of `pool` was routable (`why`). Unless --worker_wait is 0:
  // when its healthy workers all failed this request UNAVAILABLE before
  // (they were restarted), readmits them and tries again now; when none is
  // healthy, tries again in kWorkerWaitPoll (a worker restarting), within
  // the --worker_wait budget. True when it will try again; false ends the
  // run, with `why` saying how long it waited, if it did.
  bool WaitForWorker(WorkerPool& pool, Exclusions& excluded, absl::Status& why);
  absl::Status ChoosePrefill(int prompt_tokens);
  void StartPrefill();
  void OnPrefillDone(std::shared_ptr<PrefillCall> call,
                     const grpc::Status& status);
  void StartDecode(bool colocated);
  void OnDecodeMessage(int attempt_no, const pb::DecodeResponse& msg);
  void OnDecodeDone(int attempt_no, const grpc::Status& status);
  // An attempt failed with `status`: retry, migrate, or end the request.
  void AttemptFailed(absl::Status status);
  // The client went away mid-stream: stop D and end with CANCELLED.
  void ClientGone();
  void StopOnStopString();
  void StopCalls();
  void End(absl::Status status);
  bool PastDeadline() const { return absl::Now() >= deadline_; }
  // max_tokens 0 (with prompt_logprobs): the prompt scored alone. It ends
  // on the worker that computes it; no KV moves.
  bool PromptOnly() const { return stream_.request().stop.max_tokens == 0; }

  const PipelineEnv env_;
  const std::string worker_key_;  // + "#attempt": the workers' request id
  const absl::Time arrival_;
  const absl::Time deadline_;
  // Dropped once Finish has run (End): a sink may own what owns this run
  // (the gRPC reactor keeps its handle, an HTTP job its choices' handles,
  // and a handle keeps its run).
  std::shared_ptr<ResponseSink> sink_;
  EndCallback on_end_;
  SerialQueue queue_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex cancel_mu_;
  absl::Status cancel_status_ ABSL_GUARDED_BY(cancel_mu_);  // once cancelled_
  absl::Status CancelStatus();

  // State of the run (queue_ only).
  ClientStream stream_;
  std::unique_ptr<Attempt> attempt_;
  int attempt_no_ = -1;
  int failed_before_send_ = 0;  // attempts that failed before any token
  Exclusions exclude_p_, exclude_d_;
  PickHint prefill_hint_;
  absl::Status last_;              // the latest attempt's failure
  absl::Status refused_for_load_;  // the latest RESOURCE_EXHAUSTED failure
  bool ended_ = false;
  // The end of this run's --worker_wait budget (set on its first wait).
  absl::Time worker_wait_until_ = absl::InfiniteFuture();
  static constexpr absl::Duration kWorkerWaitPoll = absl::Milliseconds(100);
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_REQUEST_RUN_H_
