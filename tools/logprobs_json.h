// The JSON form of a scored token, shared by `pdserve complete` and the
// client's output (`generate --json`, JSONL): {"id", "logprob", "rank",
// "top_logprobs": [[id, logprob], ...]}. Pure functions: thread-safe.
#ifndef PDSERVE_TOOLS_LOGPROBS_JSON_H_
#define PDSERVE_TOOLS_LOGPROBS_JSON_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace pdserve {

// A prompt token's entry: {"id", "logprob", "rank", "top_logprobs"}.
inline nlohmann::json ScoredTokenJson(
    int32_t id, float logprob, int32_t rank,
    const std::vector<std::pair<int32_t, float>>& top) {
  nlohmann::json alternatives = nlohmann::json::array();
  for (const auto& [tid, lp] : top) alternatives.push_back({tid, lp});
  return {{"id", id},
          {"logprob", logprob},
          {"rank", rank},
          {"top_logprobs", alternatives}};
}

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_LOGPROBS_JSON_H_
