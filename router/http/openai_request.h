// Translation of OpenAI API request bodies (/v1/chat/completions,
// /v1/completions) into the GenerateRequests the router's pipeline runs,
// with the field checks the protocol needs before that (types, ranges the
// pipeline does not check, fields that would change the output but are not
// supported). Value checks the gRPC path also makes (temperature >= 0, an
// over-long prompt...) are left to the pipeline, so both protocols give the
// same messages. Pure functions: thread-safe.
#ifndef PDSERVE_ROUTER_HTTP_OPENAI_REQUEST_H_
#define PDSERVE_ROUTER_HTTP_OPENAI_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "pdserve/v1/generate.pb.h"

namespace pdserve::openai {

enum class Endpoint { kChat, kCompletions };

// A request as the OpenAI front runs it: one GenerateRequest per prompt
// (completions take a list of prompts; chat has one), each sampled `n`
// times. Choice index = prompt index * n + i.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;  // as sent ("" when absent)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int n = 1;
  bool echo = false;  // completions: the prompt text before the output
  // Chat: `logprobs: true`; completions: `logprobs` given (the number of
  // top alternatives is then in top_logprobs).
  bool logprobs = false;
  int top_logprobs = 0;
  // vLLM's return_tokens_as_token_ids: logprob tokens read "token_id:N".
  bool tokens_as_ids = false;
  // vLLM's prompt_logprobs extra (not with stream): each prompt token's
  // logprob, rank and this many alternatives, in the response's
  // `prompt_logprobs`.
  std::optional<int> prompt_logprobs;
  // Set when the client sent a seed; choice i then uses ChoiceSeed(seed, i).
  std::optional<uint64_t> seed;
  std::vector<pdserve::v1::GenerateRequest> prompts;
  // Completions: the text of each prompt (for echo): a string prompt's own
  // text, empty for token-id prompts (the front decodes them).
  std::vector<std::optional<std::string>> prompt_texts;
};

// An invalid request: INVALID_ARGUMENT (400) with OpenAI's `param` naming
// the field when there is one.
struct RequestError {
  absl::Status status;
  std::string param;
};

// `body` is the parsed JSON body. On error returns nullopt and fills *error.
std::optional<ParsedRequest> ParseChatRequest(const nlohmann::json& body,
                                              RequestError* error);
std::optional<ParsedRequest> ParseCompletionRequest(const nlohmann::json& body,
                                                    RequestError* error);

// The seed of choice `index` of a request sent with `seed`: seed + index
// (wrapping), so choice 0 is the request itself and choice i equals a single
// request sent with seed + i (docs/openai.md).
uint64_t ChoiceSeed(uint64_t seed, int index);

// The most choices one request may ask for (n x prompts).
inline constexpr int kMaxChoices = 128;

// max_tokens of a completions request that sets none (OpenAI's API
// reference and vLLM). Chat requests get the router's --default_max_tokens.
inline constexpr int kCompletionsDefaultMaxTokens = 16;

}  // namespace pdserve::openai

#endif  // PDSERVE_ROUTER_HTTP_OPENAI_REQUEST_H_
