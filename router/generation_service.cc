#include "router/generation_service.h"

#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/transport/sequence_spec.h"
#include "common/util/logging.h"
#include "google/protobuf/descriptor.h"
#include "router/stop_matcher.h"

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

// The client side of one Generate call: detokenizes, applies stop strings,
// writes messages and records the token metrics (TTFT, inter-token gaps,
// generated tokens). Used by the handler thread only.
class GenerationService::Stream {
 public:
  Stream(grpc::ServerWriter<v1::GenerateResponse>* writer,
         std::string request_id, ResolvedRequest req,
         const Tokenizer* tokenizer, absl::Time arrival,
         metrics::RouterMetrics* metrics)
      : writer_(writer),
        request_id_(std::move(request_id)),
        req_(std::move(req)),
        matcher_(req_.stop_strings),
        arrival_(arrival),
        metrics_(metrics) {
    if (tokenizer != nullptr) {
      detok_.emplace(*tokenizer, req_.skip_special_tokens, req_.prompt_ids);
    }
  }

  // Forwards tokens; false when the client went away. Sets stopped() when a
  // stop string completed (later tokens are dropped).
  bool Send(
      const google::protobuf::RepeatedPtrField<v1::GeneratedToken>& tokens) {
    if (stopped() || tokens.empty()) return true;
    v1::GenerateResponse msg;
    msg.set_request_id(request_id_);
    std::string text;
    for (const v1::GeneratedToken& t : tokens) {
      *msg.add_tokens() = t;
      ++completion_tokens_;
      if (detok_.has_value()) {
        auto delta = detok_->Add(t.id());
        if (delta.ok()) text += matcher_.Add(*delta);
      }
      if (matcher_.stopped()) break;
    }
    msg.set_text(std::move(text));
    sent_any_ = true;
    if (!writer_->Write(msg)) return false;
    const absl::Time now = absl::Now();
    std::optional<double> gap;
    if (last_send_.has_value()) {
      gap = absl::ToDoubleSeconds(now - *last_send_);
    } else {
      ttft_seconds_ = absl::ToDoubleSeconds(now - arrival_);
      metrics_->ObserveTimeToFirstToken(*ttft_seconds_);
    }
    last_send_ = now;
    metrics_->TokensSent(msg.tokens_size(), gap);
    return true;
  }

  // The final message, with `timings` (e2e is set here).
  bool Finish(const std::string& finish_reason, v1::StageTimings timings) {
    v1::GenerateResponse msg;
    msg.set_request_id(request_id_);
    std::string text;
    if (detok_.has_value() && !matcher_.stopped())
      text = matcher_.Add(detok_->Flush());
    text += matcher_.Flush();
    msg.set_text(std::move(text));
    msg.set_finished(true);
    msg.set_finish_reason(matcher_.stopped() ? "stop" : finish_reason);
    msg.mutable_usage()->set_prompt_tokens(
        static_cast<int>(req_.prompt_ids.size()));
    msg.mutable_usage()->set_completion_tokens(completion_tokens_);
    timings.set_e2e(SecondsSince(arrival_));
    *msg.mutable_timings() = timings;
    final_timings_ = std::move(timings);
    for (int32_t id : req_.prompt_ids) msg.add_prompt_ids(id);
    sent_any_ = true;
    return writer_->Write(msg);
  }

  bool stopped() const { return matcher_.stopped(); }
  bool sent_any() const { return sent_any_; }
  int completion_tokens() const { return completion_tokens_; }
  std::optional<double> ttft_seconds() const { return ttft_seconds_; }
  // Set once Finish ran.
  const std::optional<v1::StageTimings>& final_timings() const {
    return final_timings_;
  }
  const std::string& request_id() const { return request_id_; }
  const ResolvedRequest& request() const { return req_; }

 private:
  grpc::ServerWriter<v1::GenerateResponse>* const writer_;
  const std::string request_id_;
  const ResolvedRequest req_;
  std::optional<IncrementalDetokenizer> detok_;
  StopStringMatcher matcher_;
  int completion_tokens_ = 0;
  bool sent_any_ = false;
  const absl::Time arrival_;
  metrics::RouterMetrics* const metrics_;
  std::optional<absl::Time> last_send_;
  std::optional<double> ttft_seconds_;
  std::optional<v1::StageTimings> final_timings_;
};

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

pb::SequenceSpec MakeSpec(const std::string& id, const ResolvedRequest& req) {
  pb::SequenceSpec spec;
  spec.set_request_id(id);
  for (int32_t t : req.prompt_ids) spec.add_prompt_ids(t);
  *spec.mutable_sampling() = transport::SamplingToProto(req.sampling);
  *spec.mutable_stop() = transport::StopToProto(req.stop);
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
  const bool colocated = options_.mode == RouterMode::kColocated ||
                         (options_.mode == RouterMode::kAuto &&
                          static_cast<int>(resolved->prompt_ids.size()) <
                              options_.auto_prefill_threshold);

  std::set<std::string> exclude_p, exclude_d;
  PickHint prefill_hint;
  prefill_hint.affinity =
      PrefixAffinityKey(resolved->prompt_ids, options_.kv_block_size,
                        options_.prefix_routing_blocks);
  prefill_hint.max_extra_load = options_.prefix_routing_max_extra_load;
  absl::Status last;
  for (int attempt_no = 0; attempt_no < options_.max_attempts; ++attempt_no) {
    Attempt attempt;
    attempt.arrival = arrival;
    attempt.worker_request_id = absl::StrCat(request_id, "#", attempt_no);
    // A pool whose workers all refused for load stays RESOURCE_EXHAUSTED
    // (the client may retry), not UNAVAILABLE.
    auto d = decode_->Pick(exclude_d);
    if (!d.ok()) {
      if (!absl::IsResourceExhausted(last)) last = d.status();
      break;
    }
    attempt.decode = *d;
    if (!colocated) {
      auto p = prefill_->Pick(exclude_p, prefill_hint);
      if (!p.ok()) {
        if (!absl::IsResourceExhausted(last)) last = p.status();
        break;
      }
      attempt.prefill = *p;
    }
    if (attempt_no > 0) metrics_->CountRetry();  // re-sent to another worker
    last = colocated ? RunColocated(context, stream, attempt)
                     : RunDisaggregated(context, stream, attempt);
    if (last.ok()) return grpc::Status::OK;
    if (context->IsCancelled()) {
      AbortOn(attempt.prefill.get(), attempt.worker_request_id);
      AbortOn(attempt.decode.get(), attempt.worker_request_id);
      return ToGrpcStatus(absl::CancelledError("client cancelled"));
    }
    if (stream.sent_any() || !Retryable(last) || attempt.failed == nullptr)
      break;
    PDSERVE_LOG_WARNING("request %s: attempt %d failed on %s (%s); retrying",
                        request_id, attempt_no + 1, attempt.failed->address,
                        last.ToString());
    if (attempt.failed == attempt.prefill.get()) {
      exclude_p.insert(attempt.failed->address);
      if (absl::IsUnavailable(last)) {
        prefill_->ReportFailure(attempt.failed->address,
                                std::string(last.message()));
      }
    } else {
      exclude_d.insert(attempt.failed->address);
      if (absl::IsUnavailable(last)) {
        decode_->ReportFailure(attempt.failed->address,
                               std::string(last.message()));
      }
    }
  }
  return ToGrpcStatus(last);
}

absl::Status GenerationService::RunDisaggregated(grpc::ServerContext* context,
                                                 Stream& stream, Attempt& a) {
  WorkerEndpoint& p = *a.prefill;
  WorkerEndpoint& d = *a.decode;
  InFlight p_load(&p.in_flight);
  InFlight d_load(&d.in_flight);
  pb::PrefillRequest preq;
  *preq.mutable_seq() = MakeSpec(a.worker_request_id, stream.request());
  preq.set_decode_target(d.address);
  pb::PrefillResponse presp;
  a.timings.set_router_queue(absl::ToDoubleSeconds(absl::Now() - a.arrival));
  a.timings.set_prefill_location("prefill_worker");
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
  *dreq.mutable_colocated() = MakeSpec(a.worker_request_id, stream.request());
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
