#include "router/request_run.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/transport/sequence_spec.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"
#include "router/disaggregation_policy.h"
#include "router/request_run_calls.h"

namespace pdserve {

namespace v1 = ::pdserve::v1;
using request_run_internal::AbortAsync;

namespace {

double SecondsSince(absl::Time from) {
  return absl::ToDoubleSeconds(absl::Now() - from);
}

// Failures another worker may not have: down (UNAVAILABLE), busy
// (RESOURCE_EXHAUSTED), or a KV pool too small for the request
// (OUT_OF_RANGE; workers' pools may differ in size).
bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsResourceExhausted(s) ||
         absl::IsOutOfRange(s);
}

// A worker's reported prefill cost fit and queue, for the auto-mode policy.
PrefillCostInputs PrefillCostOf(const pb::WorkerStatusResponse& st) {
  return PrefillCostInputs{st.prefill_tokens_per_second(),
                           st.prefill_overhead_seconds(),
                           st.queued_prefill_tokens()};
}

// The sequence a worker runs: the client's prompt followed by the tokens
// already sent (after a migration), with max_tokens reduced by them and
// marked as generated (penalties on output tokens count them). The next
// token's position (prompt + generated) is then its position in the
// uninterrupted stream, so position-keyed sampling continues it exactly.
pb::SequenceSpec MakeSpec(const std::string& id, const ResolvedRequest& req,
                          const std::vector<int32_t>& generated) {
  pb::SequenceSpec spec;
  spec.set_request_id(id);
  for (int32_t t : req.prompt_ids) spec.add_prompt_ids(t);
  for (int32_t t : generated) spec.add_prompt_ids(t);
  *spec.mutable_sampling() = transport::SamplingToProto(req.sampling);
  *spec.mutable_stop() = transport::StopToProto(req.stop);
  spec.mutable_stop()->set_max_tokens(req.stop.max_tokens -
                                      static_cast<int>(generated.size()));
  spec.mutable_stop()->set_min_tokens(
      std::max(0, req.stop.min_tokens - static_cast<int>(generated.size())));
  spec.set_generated_tokens(static_cast<int32_t>(generated.size()));
  // Scored by the attempt whose first token reaches the client (a later
  // one, after a migration, continues a stream that carried them).
  if (req.prompt_logprobs >= 0 && generated.empty()) {
    spec.set_prompt_logprobs(req.prompt_logprobs);
  }
  return spec;
}

}  // namespace

std::shared_ptr<RequestRun> RequestRun::Create(
    const PipelineEnv& env, std::string request_id, std::string worker_key,
    ResolvedRequest request, absl::Time arrival, absl::Time deadline,
    std::shared_ptr<ResponseSink> sink, EndCallback on_end) {
  return std::make_shared<RequestRun>(
      env, std::move(request_id), std::move(worker_key), std::move(request),
      arrival, deadline, std::move(sink), std::move(on_end));
}

RequestRun::RequestRun(const PipelineEnv& env, std::string request_id,
                       std::string worker_key, ResolvedRequest request,
                       absl::Time arrival, absl::Time deadline,
                       std::shared_ptr<ResponseSink> sink, EndCallback on_end)
    : env_(env),
      worker_key_(std::move(worker_key)),
      arrival_(arrival),
      deadline_(deadline),
      sink_(std::move(sink)),
      on_end_(std::move(on_end)),
      stream_(sink_.get(), std::move(request_id), std::move(request),
              env.tokenizer, arrival, env.metrics) {
  const RouterOptions& o = *env_.options;
  prefill_hint_.affinity = PrefixAffinityKey(
      stream_.request().prompt_ids, o.kv_block_size, o.prefix_routing_blocks);
  prefill_hint_.max_extra_load = o.prefix_routing_max_extra_load;
}

RequestRun::~RequestRun() = default;

void RequestRun::Start() {
  queue_.Post([self = shared_from_this()] { self->StartAttempt(); });
}

void RequestRun::CancelWith(absl::Status why) {
  {
    absl::MutexLock lock(&cancel_mu_);
    if (cancelled_.load()) return;
    cancel_status_ = std::move(why);
    cancelled_.store(true);
  }
  queue_.Post([self = shared_from_this()] {
    if (self->ended_) return;
    // The calls in flight end with CANCELLED and AttemptFailed ends the run;
    // between calls, end it here.
    const bool calls_active =
        self->attempt_ != nullptr && (self->attempt_->prefill_call != nullptr ||
                                      self->attempt_->decode_call != nullptr);
    if (calls_active) {
      self->StopCalls();
    } else {
      self->End(self->CancelStatus());
    }
  });
}

absl::Status RequestRun::CancelStatus() {
  absl::MutexLock lock(&cancel_mu_);
  return cancel_status_;
}

void RequestRun::StopCalls() {
  if (attempt_ == nullptr) return;
  if (attempt_->prefill_call != nullptr)
    attempt_->prefill_call->ctx.TryCancel();
  if (attempt_->decode_call != nullptr) attempt_->decode_call->ctx.TryCancel();
}

void RequestRun::StartAttempt() {
  if (ended_) return;
  if (cancelled_.load()) return End(CancelStatus());
  if (PastDeadline()) {
    return End(absl::DeadlineExceededError(
        last_.ok() ? "deadline exceeded"
                   : absl::StrCat("deadline exceeded: ", last_.message())));
  }
  ++attempt_no_;
  attempt_ = std::make_unique<Attempt>();
  Attempt& a = *attempt_;
  a.worker_request_id = absl::StrCat(worker_key_, "#", attempt_no_);
  const int remaining = stream_.request().stop.max_tokens -
                        static_cast<int>(stream_.generated().size());
  if (remaining <= 0 && !stream_.generated().empty()) {
    // D failed after its last token but before its final message.
    stream_.Finish("length", a.timings);
    return End(absl::OkStatus());
  }
  const int prompt_tokens = static_cast<int>(
      stream_.request().prompt_ids.size() + stream_.generated().size());
  // A prompt-only request ends on the prefill worker that computes it, so it
  // needs no decode worker unless none can (ChoosePrefill's fallback, or
  // colocated mode): it is served while every decode worker is down. Any
  // other request picks D first, which auto mode's policy weighs.
  const bool prompt_only = PromptOnly();
  const auto choose_prefill = [&] {
    absl::Status picked = ChoosePrefill(prompt_tokens);
    if (picked.ok()) return true;
    if (!WaitForWorker(*env_.prefill, exclude_p_, picked)) {
      End(NoWorkerLeft(picked));
    }
    return false;
  };
  if (prompt_only && !choose_prefill()) return;
  if (a.prefill == nullptr) {
    // A pool whose workers all refused for load stays RESOURCE_EXHAUSTED
    // (the client may retry), not UNAVAILABLE.
    PickHint fits;  // D holds the whole request: its prompt and max_tokens
    fits.request_tokens =
        static_cast<int64_t>(stream_.request().prompt_ids.size()) +
        stream_.request().stop.max_tokens;
    auto d = env_.decode->Pick(exclude_d_.workers, fits);
    if (!d.ok()) {
      absl::Status why = d.status();
      if (WaitForWorker(*env_.decode, exclude_d_, why)) return;
      return End(NoWorkerLeft(why));
    }
    a.decode = *d;
  }
  if (!prompt_only && !choose_prefill()) return;
  a.timings.set_router_queue(SecondsSince(arrival_));
  if (a.prefill == nullptr) {
    StartDecode(/*colocated=*/true);
  } else {
    StartPrefill();
  }
}

absl::Status RequestRun::NoWorkerLeft(const absl::Status& why) const {
  if (absl::IsResourceExhausted(last_)) return last_;
  if (absl::IsOutOfRange(last_)) {
    return refused_for_load_.ok() ? last_ : refused_for_load_;
  }
  return why;
}

bool RequestRun::WaitForWorker(WorkerPool& pool, Exclusions& excluded,
                               absl::Status& why) {
  const RouterOptions& o = *env_.options;
  if (!absl::IsUnavailable(why) || o.worker_wait <= absl::ZeroDuration() ||
      env_.timers == nullptr || env_.timers->stopping()) {
    return false;
  }
  const auto again = [&] {
    last_ = why;
    --attempt_no_;  // the attempt counts restart with the next try
    attempt_.reset();
  };
  if (pool.healthy_count() > 0) {
    // Every healthy worker is excluded. Those this request failed on with
    // UNAVAILABLE were marked unhealthy then (ReportFailure), so a healthy
    // one has passed a health check since: restarted, it is tried again
    // (--max_attempts and --max_migrations still bound the tries). Busy
    // ones (RESOURCE_EXHAUSTED) stay excluded.
    bool readmitted = false;
    for (const std::string& w : excluded.unavailable) {
      readmitted |= excluded.workers.erase(w) > 0;
    }
    excluded.unavailable.clear();
    if (!readmitted) return false;
    again();
    queue_.Post([self = shared_from_this()] { self->StartAttempt(); });
    return true;
  }
  // No healthy worker at all (restarting, or not discovered yet): wait for
  // one, at most --worker_wait in all, never past the deadline.
  const absl::Time now = absl::Now();
  if (worker_wait_until_ == absl::InfiniteFuture()) {
    worker_wait_until_ = now + o.worker_wait;  // one budget per request
    env_.metrics->CountWorkerWait();
  }
  if (now >= worker_wait_until_) {
    why = absl::UnavailableError(absl::StrCat(
        why.message(), "; waited ", absl::FormatDuration(o.worker_wait),
        " for one (--worker_wait)"));
    return false;
  }
  excluded = Exclusions();  // whichever comes back healthy
  again();
  env_.timers->RunAt(std::min(now + kWorkerWaitPoll, deadline_),
                     [self = shared_from_this()] {
                       self->queue_.Post([self] { self->StartAttempt(); });
                     });
  return true;
}

absl::Status RequestRun::ChoosePrefill(int prompt_tokens) {
  Attempt& a = *attempt_;
  const RouterOptions& o = *env_.options;
  v1::PrefillDecision& decision = *a.timings.mutable_prefill_decision();
  prefill_hint_.request_tokens = prompt_tokens;  // P holds the prompt
  // No prefill worker routable at all: each is down, or refused this
  // request as full (its queue at --max_prefill_queue; a busy worker that
  // accepts is no reason). The decode worker prefills instead, when
  // allowed.
  // A prompt larger than every prefill worker's whole pool (known from
  // their status, or from a refusal) goes the same way.
  auto fall_back = [&](const absl::Status& no_prefill) {
    if (o.colocated_fallback &&
        (absl::IsUnavailable(no_prefill) || absl::IsOutOfRange(no_prefill))) {
      const size_t refused_for_load = exclude_p_.workers.size() -
                                      exclude_p_.unavailable.size() -
                                      exclude_p_.too_small.size();
      decision.set_reason(refused_for_load > 0 ? "prefill_workers_full"
                          : !exclude_p_.too_small.empty() ||
                                  absl::IsOutOfRange(no_prefill)
                              ? "prompt_exceeds_prefill_pool"
                              : "no_prefill_worker");
      return absl::OkStatus();
    }
    return no_prefill;
  };
  // Prompt-only (the prompt alone, scored): nothing to hand to a decode
  // worker. A prefill worker computes it, as it computes every prompt, which
  // keeps it out of the decode workers' batches, whatever auto's policy
  // would weigh; the decode worker does when colocated, or as the fallback
  // above when no prefill worker is routable.
  const bool prompt_only = PromptOnly();
  if (o.mode != RouterMode::kAuto || prompt_only) {
    decision.set_reason(prompt_only ? "prompt_only" : "mode");
    if (o.mode == RouterMode::kColocated) return absl::OkStatus();
    auto p = env_.prefill->Pick(exclude_p_.workers, prefill_hint_);
    if (!p.ok()) return fall_back(p.status());
    a.prefill = *std::move(p);
    return absl::OkStatus();
  }
  auto p = env_.prefill->Pick(exclude_p_.workers, prefill_hint_);
  DisaggregationInputs in;
  in.prompt_tokens = prompt_tokens;
  in.handoff_seconds = env_.handoff_seconds->Get();
  if (p.ok()) {
    absl::MutexLock lock(&(*p)->mu);
    in.prefill = PrefillCostOf((*p)->status);
  }
  {
    WorkerEndpoint& d = *a.decode;
    absl::MutexLock lock(&d.mu);
    const pb::WorkerStatusResponse& st = d.status;
    in.decode = PrefillCostOf(st);
    // The router's own count is fresher than the last status poll.
    in.decode_running = std::max(st.running(), d.in_flight.load());
    in.kv_receive_bytes_per_second = st.kv_receive_bytes_per_second();
    in.kv_bytes_per_token = st.kv_bytes_per_token();
    in.num_layers = st.num_layers();
  }
  DisaggregationPolicyOptions popts;
  popts.threshold_tokens = o.auto_prefill_threshold;
  popts.stall_weight = o.auto_stall_weight;
  const DisaggregationDecision dd = DecidePrefillLocation(in, popts);
  decision.set_reason(dd.reason);
  if (dd.estimate_prefill_worker.has_value()) {
    decision.set_estimate_prefill_worker(*dd.estimate_prefill_worker);
  }
  if (dd.estimate_decode_worker.has_value()) {
    decision.set_estimate_decode_worker(*dd.estimate_decode_worker);
  }
  if (dd.prefill_on_decode) return absl::OkStatus();
  if (!p.ok()) return fall_back(p.status());
  a.prefill = *std::move(p);
  return absl::OkStatus();
}

void RequestRun::StartPrefill() {
  Attempt& a = *attempt_;
  a.prefill_load.emplace(a.prefill);
  // A prompt-only request ends on P: nothing of it reaches D.
  if (!PromptOnly()) a.decode_load.emplace(a.decode);
  a.timings.set_prefill_location("prefill_worker");
  auto call = std::make_shared<PrefillCall>();
  call->ctx.set_deadline(absl::ToChronoTime(deadline_));
  *call->req.mutable_seq() =
      MakeSpec(a.worker_request_id, stream_.request(), stream_.generated());
  // Prompt-only: P opens no push, and no decode worker was picked.
  if (a.decode != nullptr) call->req.set_decode_target(a.decode->address);
  call->start = absl::Now();
  a.prefill_call = call;
  a.prefill->prefill->async()->Prefill(
      &call->ctx, &call->req, &call->resp,
      [self = shared_from_this(), call](grpc::Status s) {
        self->queue_.Post([self, call, s] { self->OnPrefillDone(call, s); });
      });
}

void RequestRun::OnPrefillDone(std::shared_ptr<PrefillCall> call,
                               const grpc::Status& s) {
  if (ended_ || attempt_ == nullptr || attempt_->prefill_call != call) return;
  Attempt& a = *attempt_;
  a.prefill_call.reset();
  if (!s.ok()) {
    a.failed = a.prefill.get();
    AbortAsync(a.decode, a.worker_request_id);  // a push may have begun
    return AttemptFailed(
        absl::Status(FromGrpcStatus(s).code(),
                     absl::StrCat("prefill worker ", a.prefill->address, ": ",
                                  s.error_message())));
  }
  if (cancelled_.load())
    return AttemptFailed(absl::CancelledError("cancelled"));
  const pb::PrefillResponse& presp = call->resp;
  a.timings.set_prefill_queue(presp.prefill_queue_seconds());
  a.timings.set_prefill_compute(presp.prefill_compute_seconds());
  a.prefill_rpc_start = call->start;
  a.prefill_queue_seconds = presp.prefill_queue_seconds();
  a.prefill_compute_seconds = presp.prefill_compute_seconds();
  if (presp.finished()) {
    // "stop": the first token is an eos or stop id, which is not part of
    // the output (as when D samples it); "length": it is the whole output.
    stream_.SetPromptLogprobs(presp.prompt_logprobs());
    // A prompt-only request has no first token: its scores are all.
    if (presp.finish_reason() != "stop" && presp.has_first_token()) {
      google::protobuf::RepeatedPtrField<v1::GeneratedToken> first;
      *first.Add() = presp.first_token();
      if (!stream_.Send(first)) return ClientGone();
    }
    stream_.Finish(presp.finish_reason(), a.timings);
    return End(absl::OkStatus());
  }
  a.first_token = presp.first_token();
  a.prompt_logprobs = presp.prompt_logprobs();
  StartDecode(/*colocated=*/false);
}

void RequestRun::StartDecode(bool colocated) {
  Attempt& a = *attempt_;
  if (!a.decode_load.has_value()) a.decode_load.emplace(a.decode);
  auto call = std::make_shared<DecodeCall>(shared_from_this(), attempt_no_);
  call->ctx.set_deadline(absl::ToChronoTime(deadline_));
  call->req.set_request_id(a.worker_request_id);
  if (colocated) {
    *call->req.mutable_colocated() =
        MakeSpec(a.worker_request_id, stream_.request(), stream_.generated());
  }
  a.awaiting_admission = !colocated;
  a.decode_call = call;
  call->Start(call, a.decode->decode.get());
}

void RequestRun::OnDecodeMessage(int attempt_no,
                                 const pb::DecodeResponse& msg) {
  if (ended_ || attempt_no != attempt_no_ || attempt_ == nullptr) return;
  Attempt& a = *attempt_;
  if (!a.protocol_error.ok()) return;  // the call is being cancelled
  if (a.awaiting_admission) {
    if (!msg.admitted()) {
      a.protocol_error =
          absl::InternalError("decode stream ended before admission");
      a.decode_call->ctx.TryCancel();
      return;
    }
    a.awaiting_admission = false;
    // The hop of the P path (for --mode=auto): Prefill sent -> D admitted,
    // less P's queue and compute.
    env_.handoff_seconds->Add(std::max(0.0, SecondsSince(a.prefill_rpc_start) -
                                                a.prefill_queue_seconds -
                                                a.prefill_compute_seconds));
    // The KV is complete and verified on D: release the first token.
    google::protobuf::RepeatedPtrField<v1::GeneratedToken> first;
    *first.Add() = *a.first_token;
    stream_.SetPromptLogprobs(a.prompt_logprobs);
    if (!stream_.Send(first)) return ClientGone();
    if (stream_.stopped()) return StopOnStopString();
    return;  // the admission message carries no tokens
  }
  if (msg.prompt_logprobs_size() > 0) {
    stream_.SetPromptLogprobs(msg.prompt_logprobs());
  }
  if (!stream_.Send(msg.tokens())) return ClientGone();
  if (stream_.stopped()) return StopOnStopString();
  if (msg.finished()) {
    // D's stages (only those it measured are set: MergeFrom keeps the
    // router's and P's).
    a.timings.MergeFrom(msg.timings());
    stream_.Finish(msg.finish_reason(), a.timings);
    return End(absl::OkStatus());
  }
}

void RequestRun::OnDecodeDone(int attempt_no, const grpc::Status& s) {
  if (ended_ || attempt_no != attempt_no_ || attempt_ == nullptr) return;
  Attempt& a = *attempt_;
  a.decode_call.reset();
  a.failed = a.decode.get();
  absl::Status st;
  if (!a.protocol_error.ok()) {
    st = a.protocol_error;
  } else if (s.ok()) {
    st = a.awaiting_admission
             ? absl::InternalError("decode stream ended before admission")
             : absl::UnavailableError("decode stream ended early");
  } else {
    st = FromGrpcStatus(s);
  }
  if (a.awaiting_admission && a.prefill != nullptr) {
    AbortAsync(a.prefill, a.worker_request_id);
  }
  if (stream_.sent_any() && !absl::IsCancelled(st)) {
    PDSERVE_LOG_WARNING("request %s: decode worker %s failed mid-stream: %s",
                        stream_.request_id(), a.decode->address, st.ToString());
  }
  AttemptFailed(absl::Status(
      st.code(),
      absl::StrCat("decode worker ", a.decode->address,
                   stream_.sent_any() ? " failed mid-stream: " : ": ",
                   st.message())));
}

void RequestRun::AttemptFailed(absl::Status status) {
  Attempt& a = *attempt_;
  last_ = status;
  const bool past_deadline = PastDeadline();
  if (cancelled_.load() || past_deadline) {
    // Also when only a worker call saw the deadline: the workers stop and
    // free the KV now, not at their lease's end.
    AbortAsync(a.prefill, a.worker_request_id);
    AbortAsync(a.decode, a.worker_request_id);
    return End(past_deadline ? absl::DeadlineExceededError(absl::StrCat(
                                   "deadline exceeded: ", status.message()))
                             : CancelStatus());
  }
  // The client did not cancel: a worker call that ended CANCELLED was cut on
  // the workers' side (D's KV push cancelled because its prefill worker
  // died), a worker failure like any other.
  if (absl::IsCancelled(status)) {
    status = absl::UnavailableError(status.message());
    last_ = status;
  }
  if (!Retryable(status) || a.failed == nullptr) return End(status);
  const RouterOptions& o = *env_.options;
  if (stream_.sent_any()) {
    // Migration: the tokens sent so far become part of the next attempt's
    // prompt and the client's stream continues where it stopped.
    if (stream_.migrations() >= o.max_migrations) return End(status);
    stream_.CountMigration();
    env_.metrics->CountMigration();
    PDSERVE_LOG_WARNING(
        "request %s: %s; migrating after %d tokens (migration %d of %d)",
        stream_.request_id(), status.ToString(), stream_.generated().size(),
        stream_.migrations(), o.max_migrations);
  } else {
    // A worker too small for the request is excluded without using up an
    // attempt: a cluster of differently sized workers may have to try each.
    if (!absl::IsOutOfRange(status) &&
        ++failed_before_send_ >= o.max_attempts) {
      return End(status);
    }
    env_.metrics->CountRetry();  // re-sent to another worker
    PDSERVE_LOG_WARNING("request %s: attempt %d failed on %s (%s); retrying",
                        stream_.request_id(), attempt_no_ + 1,
                        a.failed->address, status.ToString());
  }
  const bool prefill_failed = a.failed == a.prefill.get();
  const std::string failed_address = a.failed->address;
  Exclusions& excluded = prefill_failed ? exclude_p_ : exclude_d_;
  excluded.workers.insert(failed_address);
  if (absl::IsResourceExhausted(status)) refused_for_load_ = status;
  if (absl::IsOutOfRange(status)) excluded.too_small.insert(failed_address);
  if (absl::IsUnavailable(status)) {
    excluded.unavailable.insert(failed_address);
    (prefill_failed ? env_.prefill : env_.decode)
        ->ReportFailure(failed_address, std::string(status.message()));
  }
  StartAttempt();
}

void RequestRun::StopOnStopString() {
  // A stop string ended the text: stop D now.
  Attempt& a = *attempt_;
  a.decode_call->ctx.TryCancel();
  AbortAsync(a.decode, a.worker_request_id);
  stream_.Finish("stop", a.timings);
  End(absl::OkStatus());
}

void RequestRun::ClientGone() {
  StopCalls();
  if (attempt_ != nullptr)
    AbortAsync(attempt_->decode, attempt_->worker_request_id);
  End(absl::CancelledError("client went away"));
}

void RequestRun::End(absl::Status status) {
  if (ended_) return;
  ended_ = true;
  // Dropping the sink below may release the last handle on this run.
  const std::shared_ptr<RequestRun> keep_alive = shared_from_this();
  RequestEnd end;
  end.status = std::move(status);
  if (absl::IsResourceExhausted(end.status)) {
    end.retry_after_ms = env_.options->retry_after_ms;
  }
  // Release the workers' load counts now; calls still finishing hold only
  // their own state.
  if (attempt_ != nullptr) {
    attempt_->prefill_load.reset();
    attempt_->decode_load.reset();
  }
  // The end callback records the request in the router's metrics; it runs
  // before the client sees the end, so a scrape made after the client's
  // answer always counts it.
  if (on_end_) {
    EndCallback cb = std::move(on_end_);
    on_end_ = nullptr;
    cb(end, stream_);
  }
  // Let go of the sink with its Finish: the sink may hold this run's handle
  // (the gRPC reactor; an HTTP job's sink owns the job, which keeps it), and
  // the handle holds this run, a cycle that kept every request (and an HTTP
  // request's connection) alive forever. stream_ keeps a
  // raw pointer to the sink; nothing uses stream_ once ended_ is set.
  std::shared_ptr<ResponseSink> sink = std::move(sink_);
  sink->Finish(end);
}

}  // namespace pdserve
