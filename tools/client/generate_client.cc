#include "tools/client/generate_client.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "google/protobuf/descriptor.h"
#include "tools/logprobs_json.h"

namespace pdserve {

namespace v1 = ::pdserve::v1;

absl::StatusOr<v1::GenerateRequest> RequestFromJson(
    const std::string& line, const v1::GenerateRequest& base) {
  try {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.is_object())
      return absl::InvalidArgumentError("line is not a JSON object");
    std::optional<v1::GenerateRequest> r = base;
    if (j.contains("prompt")) r->set_text(j.at("prompt").get<std::string>());
    if (j.contains("prompt_ids")) {
      auto* ids = r->mutable_token_ids();  // an empty list stays an id prompt
      for (const auto& id : j.at("prompt_ids")) ids->add_ids(id.get<int32_t>());
    }
    auto* s = r->mutable_sampling();
    if (j.contains("max_tokens"))
      r->set_max_tokens(j.at("max_tokens").get<int32_t>());
    if (j.contains("temperature"))
      s->set_temperature(j.at("temperature").get<float>());
    if (j.contains("top_p")) s->set_top_p(j.at("top_p").get<float>());
    if (j.contains("top_k")) s->set_top_k(j.at("top_k").get<int32_t>());
    if (j.contains("min_p")) s->set_min_p(j.at("min_p").get<float>());
    if (j.contains("repetition_penalty")) {
      s->set_repetition_penalty(j.at("repetition_penalty").get<float>());
    }
    if (j.contains("presence_penalty")) {
      s->set_presence_penalty(j.at("presence_penalty").get<float>());
    }
    if (j.contains("frequency_penalty")) {
      s->set_frequency_penalty(j.at("frequency_penalty").get<float>());
    }
    if (j.contains("seed")) s->set_seed(j.at("seed").get<uint64_t>());
    if (j.contains("logit_bias")) {  // {"token id": bias}, as OpenAI's
      s->clear_logit_bias();
      for (const auto& [key, bias] : j.at("logit_bias").items()) {
        int32_t id = 0;
        if (!absl::SimpleAtoi(key, &id)) {
          return absl::InvalidArgumentError(
              absl::StrCat("logit_bias keys must be token ids, got ", key));
        }
        (*s->mutable_logit_bias())[id] = bias.get<float>();
      }
    }
    if (j.contains("ignore_eos"))
      r->set_ignore_eos(j.at("ignore_eos").get<bool>());
    if (j.contains("min_tokens"))
      r->set_min_tokens(j.at("min_tokens").get<int32_t>());
    if (j.contains("top_logprobs"))
      r->set_top_logprobs(j.at("top_logprobs").get<int32_t>());
    if (j.contains("prompt_logprobs"))
      r->set_prompt_logprobs(j.at("prompt_logprobs").get<int32_t>());
    if (j.contains("stop")) {
      r->clear_stop();
      for (const auto& st : j.at("stop")) r->add_stop(st.get<std::string>());
    }
    if (j.contains("stop_token_ids")) {
      r->clear_stop_token_ids();
      for (const auto& id : j.at("stop_token_ids"))
        r->add_stop_token_ids(id.get<int32_t>());
    }
    if (j.contains("request_id"))
      r->set_request_id(j.at("request_id").get<std::string>());
    return *r;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad JSON line: ", e.what()));
  }
}

absl::StatusOr<GenerateResult> RunGenerate(
    v1::Generation::StubInterface& stub, const v1::GenerateRequest& request,
    absl::Duration timeout,
    const std::function<void(const std::string&)>& on_text) {
  GenerateResult result;
  result.request = request;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const absl::Time start = absl::Now();
  auto reader = stub.Generate(&ctx, request);
  v1::GenerateResponse msg;
  bool first = true;
  while (reader->Read(&msg)) {
    if (first && msg.tokens_size() > 0) {
      result.ttft_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      first = false;
    }
    result.request_id = msg.request_id();
    result.prompt_logprobs.insert(result.prompt_logprobs.end(),
                                  msg.prompt_logprobs().begin(),
                                  msg.prompt_logprobs().end());
    for (const auto& t : msg.tokens()) {
      result.output_ids.push_back(t.id());
      std::vector<std::pair<int32_t, float>> top;
      for (const auto& tl : t.top_logprobs())
        top.emplace_back(tl.token_id(), tl.logprob());
      result.top_logprobs.push_back(std::move(top));
    }
    if (!msg.text().empty()) {
      result.text += msg.text();
      if (on_text) on_text(msg.text());
    }
    if (msg.finished()) {
      result.finish_reason = msg.finish_reason();
      result.usage = msg.usage();
      result.timings = msg.timings();
      result.migrations = msg.migrated() ? std::max(1, msg.migrations()) : 0;
      result.prompt_ids.assign(msg.prompt_ids().begin(),
                               msg.prompt_ids().end());
    }
  }
  grpc::Status s = reader->Finish();
  result.e2e_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!s.ok()) return FromGrpcStatus(s);
  return result;
}

nlohmann::json ResultToJson(const GenerateResult& r) {
  nlohmann::json j;
  j["request_id"] = r.request_id;
  j["prompt_ids"] = r.prompt_ids;
  j["output_ids"] = r.output_ids;
  j["finish_reason"] = r.finish_reason;
  if (r.request.top_logprobs() > 0) {
    nlohmann::json tl = nlohmann::json::array();
    for (const auto& pos : r.top_logprobs) {
      nlohmann::json row = nlohmann::json::array();
      for (const auto& [id, lp] : pos) row.push_back({id, lp});
      tl.push_back(row);
    }
    j["top_logprobs"] = tl;
  }
  if (r.request.has_prompt_logprobs()) {
    // null for the first prompt token (nothing before it scores it).
    nlohmann::json pl = nlohmann::json::array({nullptr});
    for (const auto& t : r.prompt_logprobs) {
      std::vector<std::pair<int32_t, float>> top;
      for (const auto& tl : t.top_logprobs())
        top.emplace_back(tl.token_id(), tl.logprob());
      pl.push_back(ScoredTokenJson(t.id(), t.logprob(), t.rank(), top));
    }
    j["prompt_logprobs"] = pl;
  }
  j["text"] = r.text;
  j["usage"] = {{"prompt_tokens", r.usage.prompt_tokens()},
                {"completion_tokens", r.usage.completion_tokens()}};
  j["ttft_ms"] = r.ttft_ms;
  j["e2e_ms"] = r.e2e_ms;
  // Every stage the server measured (unset = did not happen), by field name.
  nlohmann::json timings = nlohmann::json::object();
  const auto* desc = r.timings.GetDescriptor();
  const auto* refl = r.timings.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* f = desc->field(i);
    if (!refl->HasField(r.timings, f)) continue;
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) {
      timings[f->name()] = refl->GetDouble(r.timings, f);
    } else if (f->cpp_type() ==
               google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
      timings[f->name()] = refl->GetString(r.timings, f);
    }
  }
  if (r.timings.has_prefill_decision()) {
    const auto& d = r.timings.prefill_decision();
    nlohmann::json dj = {{"reason", d.reason()}};
    if (d.has_estimate_prefill_worker())
      dj["estimate_prefill_worker"] = d.estimate_prefill_worker();
    if (d.has_estimate_decode_worker())
      dj["estimate_decode_worker"] = d.estimate_decode_worker();
    timings["prefill_decision"] = std::move(dj);
  }
  j["timings"] = std::move(timings);
  j["migrated"] = r.migrations > 0;
  j["migrations"] = r.migrations;
  return j;
}

nlohmann::json ErrorToJson(const absl::Status& status) {
  return {{"error",
           {{"code", absl::StatusCodeToString(status.code())},
            {"message", std::string(status.message())}}}};
}

}  // namespace pdserve
