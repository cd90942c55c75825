// Wire forms of a sequence's parameters (SequenceSpec, carried by Prefill,
// Decode and the KV header) <-> the engine's SamplingParams / StopParams, and
// sampled tokens -> GeneratedToken. Pure functions: thread-safe.
#ifndef PDSERVE_COMMON_TRANSPORT_SEQUENCE_SPEC_H_
#define PDSERVE_COMMON_TRANSPORT_SEQUENCE_SPEC_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "common/sampling/sampler.h"
#include "pdserve/v1/worker.pb.h"

namespace pdserve::transport {

namespace pb = ::pdserve::v1::internal;

SamplingParams SamplingFromProto(const pb::SamplingParamsProto& p);
pb::SamplingParamsProto SamplingToProto(const SamplingParams& s);
// Empty eos ids in the proto become `default_eos`.
StopParams StopFromProto(const pb::StopParamsProto& p,
                         const std::vector<int32_t>& default_eos);
pb::StopParamsProto StopToProto(const StopParams& s);

void ToWireToken(int32_t id, float logprob,
                 const std::vector<std::pair<int32_t, float>>& top,
                 pdserve::v1::GeneratedToken* out);

// Prompt logprobs (ScorePromptChunk's scores) onto a response.
void ToWirePromptLogprobs(
    const std::vector<SampledToken>& scores,
    google::protobuf::RepeatedPtrField<pdserve::v1::GeneratedToken>* out);

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_SEQUENCE_SPEC_H_
