// Client side of the public API (library pdserve_client), used by `pdserve
// generate`, `pdserve up --demo_prompt` and the integration tests: applies a
// JSONL line to a request, streams one call, renders the result as JSON.
// Functions are thread-safe (each call uses its own context).
#ifndef PDSERVE_TOOLS_CLIENT_GENERATE_CLIENT_H_
#define PDSERVE_TOOLS_CLIENT_GENERATE_CLIENT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "pdserve/v1/generate.grpc.pb.h"

namespace pdserve {

struct GenerateResult {
  pdserve::v1::GenerateRequest request;
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  // request.prompt_logprobs set: entry t scores prompt token t + 1.
  std::vector<pdserve::v1::GeneratedToken> prompt_logprobs;
  std::string text;
  std::string finish_reason;
  pdserve::v1::Usage usage;
  pdserve::v1::StageTimings timings;
  double ttft_ms = 0;
  double e2e_ms = 0;
  int migrations = 0;  // times the stream moved to another decode worker
};

// One JSONL line: {"prompt": "..."} or {"prompt_ids": [...]} plus optional
// sampling/stopping fields (max_tokens, temperature, top_p, top_k, min_p,
// repetition/presence/frequency_penalty, seed, logit_bias ({"id": bias}),
// ignore_eos, min_tokens, top_logprobs, prompt_logprobs, stop,
// stop_token_ids, request_id);
// missing fields keep `base`'s values.
absl::StatusOr<pdserve::v1::GenerateRequest> RequestFromJson(
    const std::string& line, const pdserve::v1::GenerateRequest& base);

// Streams one request; `on_text` sees each text delta as it arrives. A
// failed call returns its gRPC status (code + message).
absl::StatusOr<GenerateResult> RunGenerate(
    pdserve::v1::Generation::StubInterface& stub,
    const pdserve::v1::GenerateRequest& request, absl::Duration timeout,
    const std::function<void(const std::string&)>& on_text = nullptr);

// The fields of `pdserve complete --json` plus request_id, text, usage,
// ttft_ms and per-stage timings.
nlohmann::json ResultToJson(const GenerateResult& result);
nlohmann::json ErrorToJson(const absl::Status& status);

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_CLIENT_GENERATE_CLIENT_H_
