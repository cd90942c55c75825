#include "common/transport/sequence_spec.h"

#include <algorithm>

namespace pdserve::transport {

SamplingParams SamplingFromProto(const pb::SamplingParamsProto& p) {
  SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p();
  s.min_p = p.min_p();
  s.repetition_penalty = p.repetition_penalty();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.seed = p.seed();
  s.top_logprobs = p.top_logprobs();
  // A proto map's order is unspecified: sorted, for one order everywhere.
  s.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  return s;
}

pb::SamplingParamsProto SamplingToProto(const SamplingParams& s) {
  pb::SamplingParamsProto p;
  p.set_temperature(s.temperature);
  p.set_top_k(s.top_k);
  p.set_top_p(s.top_p);
  p.set_min_p(s.min_p);
  p.set_repetition_penalty(s.repetition_penalty);
  p.set_presence_penalty(s.presence_penalty);
  p.set_frequency_penalty(s.frequency_penalty);
  p.set_seed(s.seed);
  p.set_top_logprobs(s.top_logprobs);
  for (const auto& [id, bias] : s.logit_bias)
    (*p.mutable_logit_bias())[id] = bias;
  return p;
}

StopParams StopFromProto(const pb::StopParamsProto& p,
                         const std::vector<int32_t>& default_eos) {
  StopParams s;
  s.eos_ids.assign(p.eos_ids().begin(), p.eos_ids().end());
  if (s.eos_ids.empty()) s.eos_ids = default_eos;
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.max_tokens = p.max_tokens();
  s.ignore_eos = p.ignore_eos();
  s.min_tokens = p.min_tokens();
  return s;
}

pb::StopParamsProto StopToProto(const StopParams& s) {
  pb::StopParamsProto p;
  for (int32_t id : s.eos_ids) p.add_eos_ids(id);
  for (int32_t id : s.stop_token_ids) p.add_stop_token_ids(id);
  p.set_max_tokens(s.max_tokens);
  p.set_ignore_eos(s.ignore_eos);
  p.set_min_tokens(s.min_tokens);
  return p;
}

void ToWireToken(int32_t id, float logprob,
                 const std::vector<std::pair<int32_t, float>>& top,
                 pdserve::v1::GeneratedToken* out) {
  out->set_id(id);
  out->set_logprob(logprob);
  for (const auto& [tid, lp] : top) {
    auto* t = out->add_top_logprobs();
    t->set_token_id(tid);
    t->set_logprob(lp);
  }
}

void ToWirePromptLogprobs(
    const std::vector<SampledToken>& scores,
    google::protobuf::RepeatedPtrField<pdserve::v1::GeneratedToken>* out) {
  for (const SampledToken& t : scores) {
    auto* token = out->Add();
    ToWireToken(t.id, t.logprob, t.top_logprobs, token);
    token->set_rank(t.rank);
  }
}

}  // namespace pdserve::transport
