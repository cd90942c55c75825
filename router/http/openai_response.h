// OpenAI response shapes shared by the API's handlers: the error body
// {"error": {"message", "type", "param", "code"}} with the HTTP status of a
// pipeline status code, finish reasons, and per-token logprob entries in the
// chat and the (legacy) completions shapes. Stateless: thread-safe.
#ifndef PDSERVE_ROUTER_HTTP_OPENAI_RESPONSE_H_
#define PDSERVE_ROUTER_HTTP_OPENAI_RESPONSE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "pdserve/v1/generate.pb.h"
#include "router/http/http_server.h"

namespace pdserve::openai {

// JSON text of `j`; invalid UTF-8 (a token's partial character) becomes
// U+FFFD instead of an exception.
std::string DumpJson(const nlohmann::json& j);

// 400 INVALID_ARGUMENT (and FAILED_PRECONDITION, OUT_OF_RANGE), 404
// NOT_FOUND, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED,
// 499 CANCELLED, 500 the rest.
int HttpStatusFor(absl::StatusCode code);

// {"error": {"message", "type", "param", "code"}}; empty param/code: null.
nlohmann::json ErrorJson(int http_status, const std::string& message,
                         const std::string& param = "",
                         const std::string& code = "");

// The OpenAI request parameter a pipeline status is about ("" when none):
// the field of a validation error (InvalidField, router/request_builder.h)
// by its name in the chat or the completions API ("prompt" -> "messages"
// for chat, "top_logprobs" -> "logprobs" for completions).
std::string OpenAiParamOf(const absl::Status& status, bool chat);

// Sends ErrorJson as the whole response (with Retry-After, in whole seconds
// rounded up, when retry_after_ms is set).
void SendError(http::Responder& responder, int http_status,
               const std::string& message, const std::string& param = "",
               const std::string& code = "",
               std::optional<int> retry_after_ms = std::nullopt);

// pdserve's finish reason ("length", "stop", "stop_string") in OpenAI's
// terms ("length" or "stop").
std::string OpenAiFinishReason(const std::string& reason);

// The texts of one choice's logprob tokens, each read in context: a token's
// text is what it adds to the decoded text of the tokens before it (as the
// streamed text is decoded, special tokens included), so a SentencePiece
// word keeps its leading space (" upon", not "upon"), a character split over
// byte tokens is read whole on its last token (the others read ""), and the
// texts of a choice's tokens concatenate to its text. An alternative reads
// what it would have added in the chosen token's place. With `as_ids`
// (vLLM's return_tokens_as_token_ids) tokens read "token_id:N" while the
// offsets still count the texts. One per choice; not thread-safe.
class TokenTexts {
 public:
  // `context`: the ids before the first token read (the prompt, or none
  // when the prompt's own tokens are read first). `tokenizer` may be null
  // (token-id input only): tokens read "token_id:N" and count no text.
  TokenTexts(const Tokenizer* tokenizer, bool as_ids,
             absl::Span<const int32_t> context);

  struct Entry {
    std::string token;                      // as shown
    int64_t code_points = 0;                // of its text (text_offset unit)
    std::vector<std::string> alternatives;  // as shown, in order
  };
  // Reads `id` at the next position with `alternatives` (empty for none),
  // then moves past `id`.
  Entry Next(int32_t id,
             const google::protobuf::RepeatedPtrField<pdserve::v1::TopLogprob>&
                 alternatives);

 private:
  std::string Shown(int32_t id, const std::string& text) const;

  const bool as_ids_;
  std::optional<IncrementalDetokenizer> detok_;  // none without a tokenizer
};

// One chat logprobs entry: {"token", "logprob", "bytes", "top_logprobs"}.
nlohmann::json ChatLogprob(const TokenTexts::Entry& texts,
                           const pdserve::v1::GeneratedToken& token);

// Unicode code points of UTF-8 text (OpenAI's text_offset unit).
int64_t CodePoints(const std::string& s);

// Completions with echo and logprobs: the prompt's tokens (msg.prompt_ids,
// scored by msg.prompt_logprobs with at most `alternatives` alternatives
// each; the first token: null), read by `texts` (made without context),
// appended to `logprobs` with text offsets from 0; returns the offset after
// them.
int64_t AppendPromptCompletionLogprobs(const pdserve::v1::GenerateResponse& msg,
                                       int alternatives, TokenTexts* texts,
                                       nlohmann::json* logprobs);

// vLLM's `prompt_logprobs` list: null for the first prompt token, then for
// each other {"<id>": {"logprob", "rank", "decoded_token"}} holding the
// token itself and its `alternatives` most likely ones (ranks 1, 2, ...),
// read by `texts` (made without context).
nlohmann::json VllmPromptLogprobs(const pdserve::v1::GenerateResponse& msg,
                                  int alternatives, TokenTexts* texts);

// Appends one token to a completions logprobs object {"tokens",
// "token_logprobs", "top_logprobs", "text_offset"}; `offset` is where the
// token's text starts: code points of the token texts before it.
void AppendCompletionLogprob(const TokenTexts::Entry& texts,
                             const pdserve::v1::GeneratedToken& token,
                             int64_t offset, nlohmann::json* logprobs);
// Appends each list of a completions logprobs object `more` to `logprobs`.
void ExtendCompletionLogprobs(const nlohmann::json& more,
                              nlohmann::json* logprobs);
nlohmann::json EmptyCompletionLogprobs();

}  // namespace pdserve::openai

#endif  // PDSERVE_ROUTER_HTTP_OPENAI_RESPONSE_H_
