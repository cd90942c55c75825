#include "router/generation_service.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/transport/sequence_spec.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "router/disaggregation_policy.h"

namespace pdserve {

namespace v1 = ::pdserve::v1;

absl::StatusOr<RouterMode> ParseRouterMode(const std::string& s) {
  if (s == "disaggregated") return RouterMode::kDisaggregated;
  if (s == "colocated") return RouterMode::kColocated;
  if (s == "auto") return RouterMode::kAuto;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown --mode '", s, "' (disaggregated, colocated or auto)"));
}

const char* RouterModeName(RouterMode mode) {
  switch (mode) {
    case RouterMode::kDisaggregated:
      return "disaggregated";
    case RouterMode::kColocated:
      return "colocated";
    case RouterMode::kAuto:
      return "auto";
  }
  return "?";
}

metrics::StageTimings StageTimingsFromProto(const v1::StageTimings& t) {
  metrics::StageTimings out;
  const auto* desc = t.GetDescriptor();
  const auto* refl = t.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* f = desc->field(i);
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE ||
        !refl->HasField(t, f)) {
      continue;
    }
    if (auto stage = metrics::StageFromName(f->name())) {
      out.Set(*stage, refl->GetDouble(t, f));
    }
  }
  return out;
}

namespace {

double SecondsSince(absl::Time from) {
  return absl::ToDoubleSeconds(absl::Now() - from);
}

}  // namespace

// One try of a request on a (P, D) pair.
struct GenerationService::Attempt {
  std::string worker_request_id;  // request id + attempt number
  std::shared_ptr<WorkerEndpoint> prefill;
  std::shared_ptr<WorkerEndpoint> decode;
  WorkerEndpoint* failed = nullptr;  // which worker the error came from
  absl::Time arrival;
  v1::StageTimings timings;
};

namespace {

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsResourceExhausted(s);
}

struct InFlight {
  std::atomic<int>* n;
  explicit InFlight(std::atomic<int>* c) : n(c) { n->fetch_add(1); }
  ~InFlight() { n->fetch_sub(1); }
};

// The sequence a worker runs: the client's prompt followed by the tokens
// already sent (after a migration), with max_tokens reduced by them and
// marked as generated (penalties on output tokens count them). The next
// token's position (prompt + generated) is then its position in the
// uninterrupted stream, so position-keyed sampling continues it exactly.
// A worker's reported prefill cost fit and queue, for the auto-mode policy.
PrefillCostInputs PrefillCostOf(const pb::WorkerStatusResponse& st) {
  return PrefillCostInputs{st.prefill_tokens_per_second(),
                           st.prefill_overhead_seconds(),
                           st.queued_prefill_tokens()};
}

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
  spec.set_generated_tokens(static_cast<int32_t>(generated.size()));
  return spec;
}

}  // namespace

GenerationService::GenerationService(RouterOptions options,
                                     RouterModelInfo model,
                                     std::unique_ptr<Tokenizer> tokenizer,
                                     WorkerPool* prefill, WorkerPool* decode,
                                     metrics::RouterMetrics* metrics)
    : options_(std::move(options)),
      model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      prefill_(prefill),
      decode_(decode),
      metrics_(metrics) {}

void GenerationService::AbortOn(WorkerEndpoint* ep, const std::string& id) {
  if (ep == nullptr) return;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
  pb::AbortRequest req;
  req.set_request_id(id);
  pb::AbortResponse resp;
  (void)ep->worker->Abort(&ctx, req, &resp);
}

grpc::Status GenerationService::Generate(
    grpc::ServerContext* context, const v1::GenerateRequest* request,
    grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const absl::Time arrival = absl::Now();
  InFlight guard(&in_flight_);
  metrics_->RequestStarted();
  std::unique_ptr<Stream> stream;
  grpc::Status status;
  const int in_flight = in_flight_.load();
  if (options_.max_in_flight > 0 && in_flight > options_.max_in_flight) {
    // Admission control: answer now rather than queue without bound.
    status = ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
        "router overloaded: ", in_flight - 1, " requests in flight (max ",
        options_.max_in_flight, "); retry later")));
  } else {
    status = Serve(context, request, writer, arrival, &stream);
  }
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    context->AddTrailingMetadata(kRetryAfterMsKey,
                                 std::to_string(options_.retry_after_ms));
  }
  metrics::RequestSummary summary;
  summary.code = static_cast<absl::StatusCode>(status.error_code());
  summary.e2e_seconds = SecondsSince(arrival);
  if (stream != nullptr) {
    summary.prompt_tokens =
        static_cast<int64_t>(stream->request().prompt_ids.size());
    summary.output_tokens = stream->completion_tokens();
    summary.ttft_seconds = stream->ttft_seconds();
    if (status.ok() && stream->final_timings().has_value()) {
      summary.e2e_seconds = stream->final_timings()->e2e();
      summary.stages = StageTimingsFromProto(*stream->final_timings());
    }
  }
  metrics_->RequestFinished(summary);
  return status;
}

grpc::Status GenerationService::Serve(
    grpc::ServerContext* context, const v1::GenerateRequest* request,
    grpc::ServerWriter<v1::GenerateResponse>* writer, absl::Time arrival,
    std::unique_ptr<Stream>* stream_out) {
  if (draining_.load()) {
    return ToGrpcStatus(absl::UnavailableError("router is draining"));
  }
  auto resolved =
      ResolveRequest(*request, tokenizer_.get(), model_, options_.limits);
  if (!resolved.ok()) return ToGrpcStatus(resolved.status());
  const std::string request_id =
      request->request_id().empty()
          ? absl::StrCat("req-", absl::ToUnixMicros(arrival), "-",
                         next_id_.fetch_add(1))
          : request->request_id();
  *stream_out = std::make_unique<Stream>(writer, request_id, *resolved,
                                         tokenizer_.get(), arrival, metrics_);
  Stream& stream = **stream_out;

  std::set<std::string> exclude_p, exclude_d;
  PickHint prefill_hint;
  prefill_hint.affinity =
      PrefixAffinityKey(resolved->prompt_ids, options_.kv_block_size,
                        options_.prefix_routing_blocks);
  prefill_hint.max_extra_load = options_.prefix_routing_max_extra_load;
  absl::Status last;
  int failed_before_send = 0;  // attempts that failed before any token
  for (int attempt_no = 0;; ++attempt_no) {
    Attempt attempt;
    attempt.arrival = arrival;
    attempt.worker_request_id = absl::StrCat(request_id, "#", attempt_no);
    const int remaining = stream.request().stop.max_tokens -
                          static_cast<int>(stream.generated().size());
    if (remaining <= 0) {
      // D failed after its last token but before its final message.
      stream.Finish("length", attempt.timings);
      return grpc::Status::OK;
    }
    // A pool whose workers all refused for load stays RESOURCE_EXHAUSTED
    // (the client may retry), not UNAVAILABLE.
    auto d = decode_->Pick(exclude_d);
    if (!d.ok()) {
      if (!absl::IsResourceExhausted(last)) last = d.status();
      break;
    }
    attempt.decode = *d;
    const int prompt_tokens = static_cast<int>(
        stream.request().prompt_ids.size() + stream.generated().size());
    absl::Status picked =
        ChoosePrefill(prompt_tokens, exclude_p, prefill_hint, attempt);
    if (!picked.ok()) {
      if (!absl::IsResourceExhausted(last)) last = picked;
      break;
    }
    const bool colocated = attempt.prefill == nullptr;
    last = colocated ? RunColocated(context, stream, attempt)
                     : RunDisaggregated(context, stream, attempt);
    if (last.ok()) return grpc::Status::OK;
    const bool past_deadline =
        absl::Now() >= absl::FromChrono(context->deadline());
    if (context->IsCancelled() || past_deadline) {
      // Also when only a worker call saw the propagated deadline: the
      // workers stop and free the KV now, not at their lease's end.
      AbortOn(attempt.prefill.get(), attempt.worker_request_id);
      AbortOn(attempt.decode.get(), attempt.worker_request_id);
      return ToGrpcStatus(past_deadline
                              ? absl::DeadlineExceededError(absl::StrCat(
                                    "deadline exceeded: ", last.message()))
                              : absl::CancelledError("client cancelled"));
    }
    if (!Retryable(last) || attempt.failed == nullptr) break;
    if (stream.sent_any()) {
      // Migration: the tokens sent so far become part of the next attempt's
      // prompt and the client's stream continues where it stopped.
      if (stream.migrations() >= options_.max_migrations) break;
      stream.CountMigration();
      metrics_->CountMigration();
      PDSERVE_LOG_WARNING(
          "request %s: %s; migrating after %d tokens (migration %d of %d)",
          request_id, last.ToString(), stream.generated().size(),
          stream.migrations(), options_.max_migrations);
    } else {
      if (++failed_before_send >= options_.max_attempts) break;
      metrics_->CountRetry();  // re-sent to another worker
      PDSERVE_LOG_WARNING("request %s: attempt %d failed on %s (%s); retrying",
                          request_id, attempt_no + 1, attempt.failed->address,
                          last.ToString());
    }
    const bool prefill_failed = attempt.failed == attempt.prefill.get();
    (prefill_failed ? exclude_p : exclude_d).insert(attempt.failed->address);
    if (absl::IsUnavailable(last)) {
      (prefill_failed ? prefill_ : decode_)
          ->ReportFailure(attempt.failed->address, std::string(last.message()));
    }
  }
  return ToGrpcStatus(last);
}

absl::Status GenerationService::ChoosePrefill(
    int prompt_tokens, const std::set<std::string>& exclude_p,
    const PickHint& hint, Attempt& a) {
  v1::PrefillDecision& decision = *a.timings.mutable_prefill_decision();
  if (options_.mode != RouterMode::kAuto) {
    decision.set_reason("mode");
    if (options_.mode == RouterMode::kColocated) return absl::OkStatus();
    ASSIGN_OR_RETURN(a.prefill, prefill_->Pick(exclude_p, hint));
    return absl::OkStatus();
  }
  auto p = prefill_->Pick(exclude_p, hint);
  DisaggregationInputs in;
  in.prompt_tokens = prompt_tokens;
  in.handoff_seconds = handoff_seconds_.Get();
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
  popts.threshold_tokens = options_.auto_prefill_threshold;
  popts.stall_weight = options_.auto_stall_weight;
  const DisaggregationDecision dd = DecidePrefillLocation(in, popts);
  decision.set_reason(dd.reason);
  if (dd.estimate_prefill_worker.has_value()) {
    decision.set_estimate_prefill_worker(*dd.estimate_prefill_worker);
  }
  if (dd.estimate_decode_worker.has_value()) {
    decision.set_estimate_decode_worker(*dd.estimate_decode_worker);
  }
  if (dd.prefill_on_decode) return absl::OkStatus();
  if (!p.ok()) return p.status();
  a.prefill = *std::move(p);
  return absl::OkStatus();
}

absl::Status GenerationService::RunDisaggregated(grpc::ServerContext* context,
                                                 Stream& stream, Attempt& a) {
  WorkerEndpoint& p = *a.prefill;
  WorkerEndpoint& d = *a.decode;
  InFlight p_load(&p.in_flight);
  InFlight d_load(&d.in_flight);
  pb::PrefillRequest preq;
  *preq.mutable_seq() =
      MakeSpec(a.worker_request_id, stream.request(), stream.generated());
  preq.set_decode_target(d.address);
  pb::PrefillResponse presp;
  a.timings.set_router_queue(absl::ToDoubleSeconds(absl::Now() - a.arrival));
  a.timings.set_prefill_location("prefill_worker");
  const absl::Time rpc_start = absl::Now();
  {
    auto pctx = grpc::ClientContext::FromServerContext(*context);
    grpc::Status s = p.prefill->Prefill(pctx.get(), preq, &presp);
    if (!s.ok()) {
      a.failed = &p;
      AbortOn(&d, a.worker_request_id);  // a push may have begun
      return absl::Status(
          FromGrpcStatus(s).code(),
          absl::StrCat("prefill worker ", p.address, ": ", s.error_message()));
    }
  }
  a.timings.set_prefill_queue(presp.prefill_queue_seconds());
  a.timings.set_prefill_compute(presp.prefill_compute_seconds());
  google::protobuf::RepeatedPtrField<v1::GeneratedToken> first;
  *first.Add() = presp.first_token();
  if (presp.finished()) {
    if (!stream.Send(first)) return absl::CancelledError("client went away");
    stream.Finish(presp.finish_reason(), a.timings);
    return absl::OkStatus();
  }
  auto dctx = grpc::ClientContext::FromServerContext(*context);
  pb::DecodeRequest dreq;
  dreq.set_request_id(a.worker_request_id);
  auto reader = d.decode->Decode(dctx.get(), dreq);
  pb::DecodeResponse admitted;
  if (!reader->Read(&admitted) || !admitted.admitted()) {
    grpc::Status s = reader->Finish();
    a.failed = &d;
    AbortOn(&p, a.worker_request_id);
    absl::Status st =
        s.ok() ? absl::InternalError("decode stream ended before admission")
               : FromGrpcStatus(s);
    return absl::Status(st.code(), absl::StrCat("decode worker ", d.address,
                                                ": ", st.message()));
  }
  // The hop of the P path (for --mode=auto): Prefill sent -> D admitted,
  // less P's queue and compute.
  handoff_seconds_.Add(std::max(0.0, SecondsSince(rpc_start) -
                                         presp.prefill_queue_seconds() -
                                         presp.prefill_compute_seconds()));
  // The KV is complete and verified on D: release the first token.
  if (!stream.Send(first)) {
    dctx->TryCancel();
    (void)reader->Finish();
    AbortOn(&d, a.worker_request_id);
    return absl::CancelledError("client went away");
  }
  return PumpDecode(*dctx, *reader, stream, a);
}

absl::Status GenerationService::RunColocated(grpc::ServerContext* context,
                                             Stream& stream, Attempt& a) {
  WorkerEndpoint& d = *a.decode;
  InFlight d_load(&d.in_flight);
  auto dctx = grpc::ClientContext::FromServerContext(*context);
  pb::DecodeRequest dreq;
  dreq.set_request_id(a.worker_request_id);
  *dreq.mutable_colocated() =
      MakeSpec(a.worker_request_id, stream.request(), stream.generated());
  a.timings.set_router_queue(absl::ToDoubleSeconds(absl::Now() - a.arrival));
  auto reader = d.decode->Decode(dctx.get(), dreq);
  return PumpDecode(*dctx, *reader, stream, a);
}

absl::Status GenerationService::PumpDecode(
    grpc::ClientContext& dctx,
    grpc::ClientReaderInterface<pb::DecodeResponse>& reader, Stream& stream,
    Attempt& a) {
  WorkerEndpoint& d = *a.decode;
  pb::DecodeResponse msg;
  while (reader.Read(&msg)) {
    if (!stream.Send(msg.tokens())) {
      dctx.TryCancel();
      (void)reader.Finish();
      AbortOn(&d, a.worker_request_id);
      return absl::CancelledError("client went away");
    }
    if (stream.stopped()) {
      // A stop string ended the text: stop D now.
      dctx.TryCancel();
      (void)reader.Finish();
      AbortOn(&d, a.worker_request_id);
      stream.Finish("stop", a.timings);
      return absl::OkStatus();
    }
    if (msg.finished()) {
      // D's stages (only those it measured are set: MergeFrom keeps the
      // router's and P's).
      a.timings.MergeFrom(msg.timings());
      (void)reader.Finish();
      stream.Finish(msg.finish_reason(), a.timings);
      return absl::OkStatus();
    }
  }
  grpc::Status s = reader.Finish();
  a.failed = &d;
  absl::Status st = s.ok() ? absl::UnavailableError("decode stream ended early")
                           : FromGrpcStatus(s);
  if (stream.sent_any() && !absl::IsCancelled(st)) {
    PDSERVE_LOG_WARNING("request %s: decode worker %s failed mid-stream: %s",
                        stream.request_id(), d.address, st.ToString());
  }
  return absl::Status(
      st.code(), absl::StrCat("decode worker ", d.address,
                              stream.sent_any() ? " failed mid-stream: " : ": ",
                              st.message()));
}

grpc::Status GenerationService::Tokenize(grpc::ServerContext*,
                                         const v1::TokenizeRequest* request,
                                         v1::TokenizeResponse* response) {
  if (tokenizer_ == nullptr) {
    return ToGrpcStatus(
        absl::FailedPreconditionError("this router has no tokenizer"));
  }
  if (request->text().size() >
      static_cast<size_t>(options_.limits.max_request_bytes)) {
    return ToGrpcStatus(absl::InvalidArgumentError("text too long"));
  }
  auto ids = tokenizer_->Encode(
      request->text(),
      request->has_add_special_tokens() ? request->add_special_tokens() : true);
  if (!ids.ok()) {
    return ToGrpcStatus(absl::InvalidArgumentError(ids.status().message()));
  }
  for (int32_t id : *ids) {
    response->add_ids(id);
    auto piece = tokenizer_->Decode({id}, false);
    response->add_pieces(piece.ok() ? *piece : "");
  }
  return grpc::Status::OK;
}

grpc::Status GenerationService::GetModelInfo(grpc::ServerContext*,
                                             const v1::GetModelInfoRequest*,
                                             v1::GetModelInfoResponse* r) {
  r->set_model(model_.name);
  r->set_vocab_size(model_.vocab_size);
  r->set_max_context(model_.max_context);
  for (int32_t id : model_.eos_ids) r->add_eos_token_ids(id);
  r->set_bos_token_id(model_.bos_id.value_or(-1));
  r->set_mode(RouterModeName(options_.mode));
  r->set_num_prefill_workers(prefill_->healthy_count());
  r->set_num_decode_workers(decode_->healthy_count());
  r->set_max_tokens_cap(options_.limits.max_tokens_cap);
  for (const auto& ep : decode_->Endpoints()) {
    absl::MutexLock lock(&ep->mu);
    if (ep->healthy && !ep->status.model_fingerprint().empty()) {
      r->set_fingerprint(ep->status.model_fingerprint());
      break;
    }
  }
  return grpc::Status::OK;
}

}  // namespace pdserve
