#include "router/client_stream.h"

#include <utility>

#include "absl/time/clock.h"

namespace pdserve {

ClientStream::ClientStream(ResponseSink* sink, std::string request_id,
                           ResolvedRequest req, const Tokenizer* tokenizer,
                           absl::Time arrival, metrics::RouterMetrics* metrics)
    : sink_(sink),
      request_id_(std::move(request_id)),
      req_(std::move(req)),
      matcher_(req_.stop_strings, req_.include_stop_str_in_output),
      arrival_(arrival),
      metrics_(metrics) {
  if (tokenizer != nullptr) {
    detok_.emplace(*tokenizer, req_.skip_special_tokens, req_.prompt_ids);
  }
}

void ClientStream::AttachPromptIds(v1::GenerateResponse* msg) const {
  if (msg->prompt_ids_size() > 0) return;
  for (int32_t id : req_.prompt_ids) msg->add_prompt_ids(id);
}

void ClientStream::TakePromptLogprobs(v1::GenerateResponse* msg) {
  if (!pending_prompt_logprobs_.has_value()) return;
  msg->mutable_prompt_logprobs()->Swap(&*pending_prompt_logprobs_);
  pending_prompt_logprobs_.reset();
  AttachPromptIds(msg);  // the ids they score
}

bool ClientStream::Send(
    const google::protobuf::RepeatedPtrField<v1::GeneratedToken>& tokens) {
  if (stopped() || tokens.empty()) return true;
  v1::GenerateResponse msg;
  msg.set_request_id(request_id_);
  std::string text;
  for (const v1::GeneratedToken& t : tokens) {
    *msg.add_tokens() = t;
    ++completion_tokens_;
    generated_.push_back(t.id());
    if (detok_.has_value()) {
      auto delta = detok_->Add(t.id());
      if (delta.ok()) {
        text +=
            matcher_.Add(*delta, completion_tokens_ >= req_.stop.min_tokens);
      }
    }
    if (matcher_.stopped()) break;
  }
  msg.set_text(std::move(text));
  TakePromptLogprobs(&msg);
  // The first message carries the prompt's ids when logprobs are asked for
  // (the context of the tokens' texts; the ids prompt_logprobs score).
  if (!sent_any_ && (req_.logprobs || req_.prompt_logprobs >= 0)) {
    AttachPromptIds(&msg);
  }
  sent_any_ = true;
  if (!sink_->Write(msg)) return false;
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

bool ClientStream::Finish(const std::string& finish_reason,
                          v1::StageTimings timings) {
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
  msg.set_migrated(migrations_ > 0);
  msg.set_migrations(migrations_);
  timings.set_e2e(absl::ToDoubleSeconds(absl::Now() - arrival_));
  *msg.mutable_timings() = timings;
  final_timings_ = std::move(timings);
  for (int32_t id : req_.prompt_ids) msg.add_prompt_ids(id);
  TakePromptLogprobs(&msg);
  sent_any_ = true;
  return sink_->Write(msg);
}

}  // namespace pdserve
