// Turns a public GenerateRequest into what the workers run: validates every
// field (INVALID_ARGUMENT with a message naming the problem), tokenizes text
// input, applies defaults and per-request limits. Also loads the model facts
// the router validates against. Pure functions over immutable inputs:
// thread-safe.
#ifndef PDSERVE_ROUTER_REQUEST_BUILDER_H_
#define PDSERVE_ROUTER_REQUEST_BUILDER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template/chat_template.h"
#include "common/sampling/sampler.h"
#include "common/tokenizer/tokenizer.h"
#include "pdserve/v1/generate.pb.h"

namespace pdserve {

// The request field an INVALID_ARGUMENT of ResolveRequest or RenderChat is
// about, by its name in generate.proto ("temperature", "max_tokens",
// "prompt" for any prompt input, "chat" for the conversation, ...); "" when
// the status names none. Front doors map it to their own names (the HTTP
// API's error "param").
std::string InvalidField(const absl::Status& status);
// The machine-readable reason of such a status, in OpenAI's words
// ("context_length_exceeded": prompt + max_tokens beyond the model's
// context); "" for the others. The HTTP API's error "code".
std::string InvalidReason(const absl::Status& status);

// What the router knows about the served model.
struct RouterModelInfo {
  std::string name;
  int vocab_size = 0;
  int max_context = 0;
  std::vector<int32_t> eos_ids;
  std::optional<int32_t> bos_id;
};
// From a model directory (config.json, generation_config.json) or
// "synthetic:NAME".
absl::StatusOr<RouterModelInfo> LoadRouterModelInfo(const std::string& model);

// Per-request limits (flags with safe defaults).
struct RequestLimits {
  int default_max_tokens = 256;
  int max_tokens_cap = 4096;
  int max_prompt_tokens = 32768;
  int max_stop_strings = 16;
  int max_stop_string_bytes = 256;
  int max_stop_token_ids = 64;
  int max_top_logprobs = 20;
  int max_logit_bias = 1024;  // entries of logit_bias
  int max_request_bytes = 1 << 20;
};

// The model's chat templates, or why there are none (the message chat
// requests are refused with).
struct ChatSupport {
  const ModelChatTemplates* templates = nullptr;
  absl::Status unavailable = absl::FailedPreconditionError(
      "this router has no chat template: start it with --chat_template=FILE");
};

// A conversation rendered with the chat template and tokenized WITHOUT
// special tokens (the template writes BOS itself).
struct RenderedChat {
  std::string text;
  std::vector<int32_t> ids;
};
// INVALID_ARGUMENT for a bad message, tools or kwargs value and for template
// errors (with the template's own message); FAILED_PRECONDITION without a
// template.
absl::StatusOr<RenderedChat> RenderChat(const pdserve::v1::ChatInput& chat,
                                        const ChatSupport& support,
                                        const Tokenizer* tokenizer);

struct ResolvedRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  StopParams stop;  // eos ids left empty: the workers use the model's
  std::vector<std::string> stop_strings;
  bool include_stop_str_in_output = false;  // keep the stop string's text
  bool skip_special_tokens = true;
  int prompt_logprobs = -1;  // >= 0: score the prompt (-1: off)
  // top_logprobs was set: the first message carries prompt_ids too, so the
  // client can read each token's text in context.
  bool logprobs = false;
};

// `tokenizer` may be null (token-id input only).
absl::StatusOr<ResolvedRequest> ResolveRequest(
    const pdserve::v1::GenerateRequest& request, const Tokenizer* tokenizer,
    const ChatSupport& chat, const RouterModelInfo& model,
    const RequestLimits& limits);

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_REQUEST_BUILDER_H_
