// GenerationScheduler: in-process continuous batching over one Engine. It owns
// a thread that, at every step, admits waiting requests (FIFO, up to
// max_num_seqs, while free KV stays above a watermark, reusing cached prefix
// blocks), runs one Forward over every running sequence (one decode token
// each) plus pending prompts (chunked) within the token budget, samples, and
// reports each generated token through the request's callback. KV grows on
// demand; when blocks run out the newest sequence is preempted (blocks freed,
// requeued, later re-prefilled with prompt + its output so far: the
// position-keyed sampling keeps its stream exact). Thread-safe: Submit/
// Cancel/WithEngine/stats may be called from any thread; callbacks run on
// the scheduler thread.
#ifndef PDSERVE_COMMON_ENGINE_SCHEDULER_H_
#define PDSERVE_COMMON_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine.h"
#include "common/sampling/sampler.h"

namespace pdserve {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  // stop.max_tokens is the number of tokens to generate at most; empty
  // stop.eos_ids are filled from the engine's generation config.
  StopParams stop;
  // How many trailing prompt_ids this stream generated earlier (a request
  // resumed elsewhere, e.g. after a migration, with its output so far as
  // prompt): the sampler counts them as output tokens (presence/frequency
  // penalties), so the continuation equals the uninterrupted stream's.
  // Positions stay absolute (prompt_ids.size() + tokens generated here).
  int generated_tokens = 0;
  // >= 0: score the prompt's tokens (vLLM's prompt_logprobs): the first
  // event carries, for each prompt token after the first, its raw logprob
  // given the ones before it and this many most likely alternatives. Such
  // a request computes its whole prompt (no cached prefix is attached).
  // With stop.max_tokens 0 it is the prompt alone: one final event
  // ("length", no token) carries the scores.
  int prompt_logprobs = -1;
};

// One event per generated token; the last event has finished = true.
struct TokenEvent {
  bool has_token = false;  // false for the final event of an eos/stop id
  int32_t token_id = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  bool finished = false;
  std::string finish_reason;   // "stop" | "length" | "error" | "cancelled"
  int32_t stop_token_id = -1;  // the eos/stop id that ended it (not output)
  absl::Status status;         // non-OK with finish_reason "error"
  // First event of a request with prompt_logprobs >= 0: entry t scores
  // prompt token t + 1 (ScoreToken).
  std::vector<SampledToken> prompt_logprobs;
};
using TokenCallback = std::function<void(const TokenEvent&)>;

struct SchedulerOptions {
  int max_num_seqs = 64;         // running sequences at most (batch size)
  int max_batch_tokens = 0;      // 0 = the engine's max_batch_tokens
  int prefill_chunk_tokens = 0;  // 0 = no chunk limit beyond the budget
  // A new request is admitted only while the free blocks left after its
  // prompt's stay >= this fraction of the pool (headroom for the running
  // sequences' growth); the first running sequence is exempt.
  double kv_watermark = 0.01;
  // The old behaviour: reserve prompt + max_tokens blocks at admission, so a
  // running sequence never needs more and is never preempted.
  bool reserve_full_request = false;
  // Attach cached prefix blocks at admission (and at re-admission after a
  // preemption), computing only the rest of the prompt.
  bool use_prefix_cache = true;
  // Optional (metrics): called on the scheduler thread after every step that
  // made progress, with its wall time; the engine is idle meanwhile. Must be
  // quick and must not call Submit/Cancel/WithEngine.
  std::function<void(double step_seconds)> on_step;
  // Requests queued beyond the batch's free slots at most: Submit answers
  // RESOURCE_EXHAUSTED once max_num_seqs + max_waiting requests are held
  // (submitted, final event not sent), what a decode worker reports as its
  // capacity, even while a burst has not reached the batch yet. 0 =
  // unbounded. SubmitWithKv is never refused for it (the sequence's KV
  // blocks are already reserved: refusing would waste its prefill and
  // transfer) but counts as held. Preempted requests always requeue.
  int max_waiting = 0;
};

// INVALID_ARGUMENT naming the first option out of range: max_num_seqs >= 1
// (0 would admit nothing and hang every request), max_batch_tokens,
// prefill_chunk_tokens and max_waiting >= 0, kv_watermark in [0, 1).
absl::Status CheckSchedulerOptions(const SchedulerOptions& options);

// A snapshot of the scheduler's queues and cumulative counters.
struct SchedulerStats {
  int running = 0;
  int waiting = 0;  // queued, including preempted requests
  int64_t preemptions = 0;
  int64_t prefill_tokens_computed = 0;  // prompt (and re-prefill) tokens run
  int64_t prefix_hit_tokens = 0;        // prompt tokens reused from the cache
  int64_t decode_tokens = 0;            // single-token decode items run
  int64_t rejected = 0;                 // submissions refused (queue full)
};

class GenerationScheduler {
 public:
  using RequestId = int64_t;

  // `engine` must outlive the scheduler; the scheduler thread drives it.
  GenerationScheduler(Engine* engine, const SchedulerOptions& options);
  ~GenerationScheduler();  // cancels everything left and joins the thread

  // Queues a request; its prompt's blocks are reserved when it is admitted
  // (prompt + max_tokens with reserve_full_request). Invalid requests fail at
  // once (INVALID_ARGUMENT); a full queue (max_waiting) is RESOURCE_EXHAUSTED.
  absl::StatusOr<RequestId> Submit(GenerationRequest request,
                                   TokenCallback callback);
  // Admits a sequence whose prompt KV is already in the engine (imported from
  // a prefill worker), whatever max_waiting: `seq` holds prompt_ids.size()
  // tokens of KV, and `first_token` (already sampled at position prompt_len
  // and already reported to the client by the caller) is fed at the next
  // step. The scheduler takes ownership of `seq` (frees it when done).
  absl::StatusOr<RequestId> SubmitWithKv(GenerationRequest request, SeqId seq,
                                         int32_t first_token,
                                         TokenCallback callback);
  // A new sequence with room for `prompt_tokens` of KV about to be imported
  // (a push beginning) for a request that may generate `max_tokens` more, by
  // the policy local requests follow: the prompt's blocks alone (the rest
  // grows on demand, as a running sequence's does; with
  // reserve_full_request, prompt + max_tokens). OUT_OF_RANGE when prompt +
  // max_tokens exceed the whole pool; RESOURCE_EXHAUSTED while the pool
  // cannot spare the blocks now: fewer free than that plus the watermark
  // (while sequences run), or queued requests already waiting for blocks
  // (a push must not take the blocks a preempted sequence waits for).
  // The caller owns the sequence (SubmitWithKv, or Engine::FreeSequence
  // through WithEngine).
  absl::StatusOr<SeqId> CreateSequenceForImport(int prompt_tokens,
                                                int max_tokens);
  // Stops a request and frees its blocks; its callback gets a final
  // "cancelled" event unless it already finished. Idempotent.
  void Cancel(RequestId id);
  // Runs fn on the engine between steps (e.g. KV imports from another
  // thread); blocks until done.
  void WithEngine(const std::function<void(Engine&)>& fn);
  // Blocks until every submitted request has had its final event and its
  // blocks are freed.
  void WaitIdle();

  int num_running() const;
  int num_waiting() const;
  SchedulerStats stats() const;

 private:
  struct Request;
  absl::Status ValidateRequest(GenerationRequest* request) const;
  // A validated request, not yet queued.
  static std::unique_ptr<Request> NewRequest(GenerationRequest request,
                                             TokenCallback callback);
  absl::StatusOr<RequestId> Enqueue(std::unique_ptr<Request> request);
  // Delivers the final event, then counts the request as done (WaitIdle).
  void Finish(Request& r, TokenEvent event);
  void Loop();
  // Cancellations, admissions, one Forward, sampling; false when nothing ran.
  bool Step() ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_mu_);
  // Admits waiting requests while they fit; true when one was admitted.
  bool Admit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_mu_);
  // Gives `r` its KV for admission: OK, RESOURCE_EXHAUSTED (not enough free
  // blocks now; `r` holds none) or another error (it fails).
  absl::Status AdmitOne(Request& r, int64_t* hit_tokens)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_mu_, mu_);
  // Plans each running sequence's tokens for this step within the budget and
  // grows its KV, preempting the newest sequences when blocks run out.
  bool PlanAndReserve() ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_mu_);
  // Frees the KV of running_[index] and requeues it at the front.
  void Preempt(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_mu_);
  // Frees finished sequences; true when one was removed.
  bool Retire() ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_mu_);

  Engine* const engine_;
  const SchedulerOptions options_;
  int max_batch_tokens_;

  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Request>> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<RequestId> cancelled_ ABSL_GUARDED_BY(mu_);
  int num_running_ ABSL_GUARDED_BY(mu_) = 0;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // submitted, final event not sent
  // Submitted, final event not being sent yet: what max_waiting bounds.
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  // The last admission stopped at a queued request short of KV blocks.
  bool waiting_for_blocks_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  RequestId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  SchedulerStats counters_ ABSL_GUARDED_BY(mu_);  // cumulative fields only

  // Held by the loop while it drives the engine, and by WithEngine.
  absl::Mutex engine_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<std::unique_ptr<Request>> running_ ABSL_GUARDED_BY(engine_mu_);
  std::vector<float> logits_ ABSL_GUARDED_BY(engine_mu_);

  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_SCHEDULER_H_
