#include "decode_worker/decode_worker.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/cancellation_poll.h"
#include "common/grpc_util/grpc_util.h"
#include "common/transport/sequence_spec.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"

namespace pdserve {
namespace {

// A token event and when the scheduler produced it (the stage timings use
// the production time, not when the handler got round to it).
struct TimedEvent {
  TokenEvent event;
  absl::Time time;
};

// Token events of one stream, filled by the scheduler thread and drained by
// the gRPC handler thread. Thread-safe.
class EventQueue {
 public:
  void Push(const TokenEvent& event) {
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&mu_);
    events_.push_back({event, now});
  }
  // Waits up to `timeout` for events; returns all that are queued.
  std::deque<TimedEvent> PopAll(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](std::deque<TimedEvent>* e) { return !e->empty(); }, &events_),
        timeout);
    return std::exchange(events_, {});
  }

 private:
  absl::Mutex mu_;
  std::deque<TimedEvent> events_ ABSL_GUARDED_BY(mu_);
};

double Seconds(absl::Time from, absl::Time to) {
  return absl::ToDoubleSeconds(to - from);
}

// The scheduler's request for a sequence (colocated or imported): empty
// eos ids are filled by the scheduler from the generation config.
GenerationRequest RequestFromSpec(const pb::SequenceSpec& spec) {
  GenerationRequest req;
  req.prompt_ids.assign(spec.prompt_ids().begin(), spec.prompt_ids().end());
  req.sampling = transport::SamplingFromProto(spec.sampling());
  req.stop = transport::StopFromProto(spec.stop(), {});
  req.generated_tokens = spec.generated_tokens();
  if (spec.has_prompt_logprobs()) req.prompt_logprobs = spec.prompt_logprobs();
  return req;
}

}  // namespace

DecodeWorker::DecodeWorker(const DecodeWorkerOptions& options)
    : options_(options) {}

DecodeWorker::~DecodeWorker() {
  // The service's pushes end before the transports they read through; the
  // table frees through the scheduler; the scheduler drives the engine.
  kv_service_.reset();
  kv_transports_.reset();
  leases_.reset();
  scheduler_.reset();
  engine_.reset();
}

absl::StatusOr<std::unique_ptr<DecodeWorker>> DecodeWorker::Create(
    const DecodeWorkerOptions& options) {
  if (options.metrics == nullptr) {
    return absl::InvalidArgumentError("DecodeWorkerOptions.metrics is null");
  }
  RETURN_IF_ERROR(CheckSchedulerOptions(options.scheduler));
  if (options.kv_lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_lease_seconds must be positive, got ",
                     absl::ToDoubleSeconds(options.kv_lease)));
  }
  std::unique_ptr<DecodeWorker> w(new DecodeWorker(options));
  auto engine = Engine::Create(options.engine);
  if (!engine.ok()) return engine.status();
  w->engine_ = *std::move(engine);
  SchedulerOptions sched = options.scheduler;
  sched.on_step = [p = w.get()](double seconds) { p->OnStep(seconds); };
  w->scheduler_ =
      std::make_unique<GenerationScheduler>(w->engine_.get(), sched);
  w->leases_ = std::make_unique<KvLeaseTable>(
      w->scheduler_.get(), w->engine_.get(), options.kv_lease, options.metrics);
  w->ExportGauges(w->engine_->free_blocks(), w->engine_->total_blocks());
  // The largest chunk ChunkTokenRanges cuts: kKvChunkTargetBytes, or one
  // token of one layer if that is more.
  auto kv = transport::KvReceiveTransports::Create(
      options.kv_transport,
      std::max(transport::kKvChunkTargetBytes,
               w->engine_->kv_layout().BytesPerTokenPerLayer()));
  if (!kv.ok()) return kv.status();
  w->kv_transports_ = *std::move(kv);
  w->kv_service_ = std::make_unique<transport::KvTransferService>(
      w->leases_.get(), w->kv_transports_->options());
  return w;
}

void DecodeWorker::OnStep(double seconds) {
  metrics::DecodeMetrics& m = *options_.metrics;
  const SchedulerStats now = scheduler_->stats();
  const SchedulerStats& last = last_stats_;
  // Decode items run in this step = sequences decoding in its batch.
  m.ObserveStep(now.decode_tokens - last.decode_tokens, seconds);
  for (int64_t i = last.preemptions; i < now.preemptions; ++i) {
    m.CountPreemption();
  }
  // Prompt tokens admitted = computed + reused from the prefix cache.
  const int64_t hits = now.prefix_hit_tokens - last.prefix_hit_tokens;
  const int64_t computed =
      now.prefill_tokens_computed - last.prefill_tokens_computed;
  if (hits + computed > 0)
    m.compute().ObservePrefixLookup(hits + computed, hits);
  // The prefill cost fit (--mode=auto): a step's seconds against the prompt
  // tokens it computed (its decode items land in the fit's overhead).
  if (computed > 0) prefill_cost_.Add(static_cast<double>(computed), seconds);
  last_stats_ = now;
  ExportGauges(engine_->free_blocks(), engine_->total_blocks());
}

int64_t DecodeWorker::KvBytesPerToken() const {
  const KvLayout layout = engine_->kv_layout();
  return layout.BytesPerTokenPerLayer() * layout.num_layers;
}

void DecodeWorker::ExportGauges(int64_t free_blocks, int64_t total_blocks) {
  metrics::DecodeMetrics& m = *options_.metrics;
  m.SetRunning(scheduler_->num_running());
  m.SetWaiting(scheduler_->num_waiting());
  m.kv_pool().Set(total_blocks - free_blocks, total_blocks);
}

std::vector<grpc::Service*> DecodeWorker::services() {
  return {static_cast<pb::Decode::Service*>(this),
          static_cast<pb::Worker::Service*>(this), kv_service_.get()};
}

grpc::Status DecodeWorker::Decode(
    grpc::ServerContext* context, const pb::DecodeRequest* request,
    grpc::ServerWriter<pb::DecodeResponse>* writer) {
  if (draining_.load()) {
    return ToGrpcStatus(absl::UnavailableError("decode worker is draining"));
  }
  if (request->request_id().empty()) {
    return ToGrpcStatus(absl::InvalidArgumentError("empty request id"));
  }
  active_streams_.fetch_add(1);
  struct Guard {
    std::atomic<int>* n;
    ~Guard() { n->fetch_sub(1); }
  } guard{&active_streams_};

  const absl::Time claim_time = absl::Now();
  const std::string& id = request->request_id();
  auto queue = std::make_shared<EventQueue>();
  auto callback = [queue](const TokenEvent& e) { queue->Push(e); };
  const bool colocated = request->has_colocated();
  pdserve::v1::StageTimings timings;
  absl::StatusOr<GenerationScheduler::RequestId> rid;
  // Disaggregated: when admission could begin (claimed and KV complete).
  absl::Time admission_start = claim_time;
  // When the sequence was handed to the scheduler; read before the call, as
  // the scheduler thread may produce its first token before the call returns.
  absl::Time submitted;
  // Colocated: the prompt's tokens count as queued prefill work until its
  // first token (or the end).
  struct QueuedPrefill {
    std::atomic<int64_t>* counter = nullptr;
    int64_t tokens = 0;
    void Set(std::atomic<int64_t>* c, int64_t n) {
      counter = c;
      tokens = n;
      c->fetch_add(n);
    }
    void Release() {
      if (counter != nullptr) counter->fetch_sub(tokens);
      counter = nullptr;
    }
    ~QueuedPrefill() { Release(); }
  } queued_prefill;
  if (colocated) {
    const pb::SequenceSpec& spec = request->colocated();
    submitted = absl::Now();
    rid = scheduler_->Submit(RequestFromSpec(spec), callback);
    if (rid.ok()) {
      prefill_tokens_.fetch_add(spec.prompt_ids_size());
      queued_prefill.Set(&queued_prefill_tokens_, spec.prompt_ids_size());
    }
    timings.set_prefill_location("decode_worker");
  } else {
    auto ready =
        leases_->Claim(id, [context] { return context->IsCancelled(); });
    if (!ready.ok()) return ToGrpcStatus(ready.status());
    const SeqId seq = ready->seq;
    submitted = absl::Now();
    rid = scheduler_->SubmitWithKv(RequestFromSpec(ready->spec), seq,
                                   ready->first_token.id(), callback);
    if (!rid.ok()) {
      scheduler_->WithEngine([seq](Engine& e) { e.FreeSequence(seq); });
    }
    // D's own stages only; the router has P's (prefill_queue/compute).
    timings.set_kv_transfer(ready->kv_transfer_seconds);
    if (ready->kv_transfer_seconds > 0) {
      kv_receive_rate_.Add(static_cast<double>(ready->spec.prompt_ids_size()) *
                           KvBytesPerToken() / ready->kv_transfer_seconds);
    }
    admission_start = std::max(claim_time, ready->kv_complete);
    timings.set_kv_transfer_tail(Seconds(claim_time, admission_start));
    timings.set_prefill_location("prefill_worker");
  }
  if (!rid.ok()) return ToGrpcStatus(rid.status());
  if (!colocated) {
    timings.set_decode_admission(Seconds(admission_start, submitted));
    options_.metrics->ObserveAdmissionWait(timings.decode_admission());
  }
  {
    absl::MutexLock lock(&mu_);
    active_[id] = *rid;
  }
  auto unregister = [&] {
    absl::MutexLock lock(&mu_);
    active_.erase(id);
  };
  bool write_ok = true;
  if (!colocated) {
    pb::DecodeResponse first;
    first.set_admitted(true);
    write_ok = writer->Write(first);
  }
  int tokens = 0;
  std::optional<absl::Time> first_step;
  absl::Time last_event = submitted;
  bool cancel_sent = false;
  CancellationPoll poll;
  while (true) {
    if (!cancel_sent && (!write_ok || context->IsCancelled())) {
      scheduler_->Cancel(*rid);
      cancel_sent = true;
    }
    std::deque<TimedEvent> events = queue->PopAll(poll.Interval());
    if (events.empty()) continue;
    poll.Reset();
    pb::DecodeResponse msg;
    const TokenEvent* final_event = nullptr;
    for (const TimedEvent& te : events) {
      const TokenEvent& e = te.event;
      last_event = te.time;
      transport::ToWirePromptLogprobs(e.prompt_logprobs,
                                      msg.mutable_prompt_logprobs());
      if (e.has_token) {
        if (!first_step.has_value()) {
          first_step = last_event;
          queued_prefill.Release();
        }
        transport::ToWireToken(e.token_id, e.logprob, e.top_logprobs,
                               msg.add_tokens());
        ++tokens;
      }
      if (e.finished) {
        final_event = &e;
        break;
      }
    }
    tokens_generated_.fetch_add(msg.tokens_size());
    options_.metrics->AddGeneratedTokens(msg.tokens_size());
    if (options_.testonly_stream_delay > absl::ZeroDuration() && !cancel_sent) {
      for (const auto& token : msg.tokens()) {
        pb::DecodeResponse one;
        *one.add_tokens() = token;
        if (!writer->Write(one)) write_ok = false;
        absl::SleepFor(options_.testonly_stream_delay);
      }
      msg.clear_tokens();
    }
    if (final_event == nullptr) {
      if (!cancel_sent &&
          (msg.tokens_size() > 0 || msg.prompt_logprobs_size() > 0) &&
          !writer->Write(msg)) {
        write_ok = false;
      }
      continue;
    }
    unregister();
    if (final_event->finish_reason == "cancelled") {
      cancelled_.fetch_add(1);
      return ToGrpcStatus(absl::CancelledError("decode request cancelled"));
    }
    if (final_event->finish_reason == "error") {
      cancelled_.fetch_add(1);
      return ToGrpcStatus(final_event->status.ok()
                              ? absl::InternalError("decode failed")
                              : final_event->status);
    }
    const absl::Time first = first_step.value_or(last_event);
    if (colocated) {
      // The first token came from this worker's prefill step.
      timings.set_prefill_compute(Seconds(claim_time, first));
      options_.metrics->compute().ObserveCompute(
          timings.prefill_compute(), request->colocated().prompt_ids_size());
    } else {
      timings.set_first_decode_step(Seconds(submitted, first));
    }
    timings.set_decode(Seconds(first, last_event));
    msg.set_finished(true);
    msg.set_finish_reason(final_event->finish_reason);
    *msg.mutable_timings() = timings;
    completed_.fetch_add(1);
    if (!writer->Write(msg)) {
      return ToGrpcStatus(absl::CancelledError("router went away"));
    }
    return grpc::Status::OK;
  }
}

grpc::Status DecodeWorker::Status(grpc::ServerContext*,
                                  const pb::WorkerStatusRequest*,
                                  pb::WorkerStatusResponse* r) {
  r->set_role("decode");
  r->set_model_fingerprint(engine_->fingerprint());
  int64_t free_blocks = 0, total_blocks = 0, cached_blocks = 0;
  scheduler_->WithEngine([&](Engine& e) {
    free_blocks = e.free_blocks();
    total_blocks = e.total_blocks();
    cached_blocks = e.stats().prefix.cached_blocks;
  });
  r->set_prefix_cached_blocks(cached_blocks);
  const SchedulerStats stats = scheduler_->stats();
  r->set_prefix_hit_tokens(stats.prefix_hit_tokens);
  r->set_requests_rejected(stats.rejected);
  r->set_free_kv_blocks(free_blocks);
  r->set_total_kv_blocks(total_blocks);
  if (!options_.testonly_hide_kv_pool_size) {
    r->set_kv_block_size(engine_->kv_layout().block_size);
  }
  ExportGauges(free_blocks, total_blocks);
  r->set_running(scheduler_->num_running());
  r->set_waiting(scheduler_->num_waiting());
  r->set_queue_depth(scheduler_->num_waiting());
  const SchedulerOptions& limits = options_.scheduler;
  r->set_request_capacity(
      limits.max_waiting > 0 ? limits.max_num_seqs + limits.max_waiting : 0);
  r->set_pending_leases(leases_->pending());
  r->set_prefill_tokens_computed(prefill_tokens_.load());
  r->set_decode_tokens_generated(tokens_generated_.load());
  // For the router's --mode=auto policy.
  const CostFit::Estimate cost = prefill_cost_.Get();
  r->set_prefill_tokens_per_second(cost.rate);
  r->set_prefill_overhead_seconds(cost.overhead);
  r->set_queued_prefill_tokens(queued_prefill_tokens_.load());
  r->set_kv_receive_bytes_per_second(kv_receive_rate_.Get());
  r->set_kv_bytes_per_token(KvBytesPerToken());
  r->set_num_layers(engine_->kv_layout().num_layers);
  const auto& c = kv_service_->counters();
  r->set_kv_bytes_received(c.bytes.load());
  r->set_kv_pushes_received(c.pushes.load());
  r->set_checksum_failures(c.checksum_failures.load());
  const transport::UcxStats u = kv_transports_->ucx_stats();
  transport::FillUcxStatus(u, r);
  options_.metrics->ucx().Set(u.endpoints, u.registered_bytes, u.transfers,
                              u.endpoint_errors, u.mapped_buffers);
  r->set_lease_expiries(leases_->lease_expiries());
  r->set_requests_completed(completed_.load());
  r->set_requests_cancelled(cancelled_.load());
  r->set_draining(draining_.load());
  return grpc::Status::OK;
}

grpc::Status DecodeWorker::Abort(grpc::ServerContext*,
                                 const pb::AbortRequest* request,
                                 pb::AbortResponse* response) {
  bool found = leases_->Abort(request->request_id());
  std::optional<GenerationScheduler::RequestId> rid;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(request->request_id());
    if (it != active_.end()) rid = it->second;
  }
  if (rid.has_value()) {
    scheduler_->Cancel(*rid);
    found = true;
  }
  response->set_found(found);
  return grpc::Status::OK;
}

}  // namespace pdserve
