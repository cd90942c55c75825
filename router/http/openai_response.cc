#include "router/http/openai_response.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "router/request_builder.h"

namespace pdserve::openai {

using nlohmann::json;

std::string DumpJson(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kCancelled:
      return 499;  // the client closed the request (nginx's code)
    default:
      return 500;
  }
}

std::string OpenAiParamOf(const absl::Status& status, bool chat) {
  const std::string field = InvalidField(status);
  if (field == "chat") return "messages";
  if (field == "prompt" && chat) return "messages";
  if (field == "top_logprobs" && !chat) return "logprobs";
  return field;
}

json ErrorJson(int http_status, const std::string& message,
               const std::string& param, const std::string& code) {
  const char* type = http_status == 429   ? "rate_limit_error"
                     : http_status >= 500 ? "server_error"
                     : http_status == 404 ? "not_found_error"
                                          : "invalid_request_error";
  json error = {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", std::move(error)}};
}

void SendError(http::Responder& responder, int http_status,
               const std::string& message, const std::string& param,
               const std::string& code, std::optional<int> retry_after_ms) {
  http::Headers headers;
  if (retry_after_ms.has_value()) {
    // Whole seconds (RFC 9110), and the exact hint in the header OpenAI's
    // SDKs read first.
    headers.emplace_back(
        "Retry-After",
        std::to_string((std::max(*retry_after_ms, 1) + 999) / 1000));
    headers.emplace_back("retry-after-ms",
                         std::to_string(std::max(*retry_after_ms, 0)));
  }
  responder.Send(http_status, "application/json",
                 DumpJson(ErrorJson(http_status, message, param, code)),
                 std::move(headers));
}

std::string OpenAiFinishReason(const std::string& reason) {
  return reason == "length" ? "length" : "stop";
}

TokenTexts::TokenTexts(const Tokenizer* tokenizer, bool as_ids,
                       absl::Span<const int32_t> context)
    : as_ids_(as_ids) {
  if (tokenizer != nullptr) {
    detok_.emplace(*tokenizer, /*skip_special_tokens=*/false, context);
  }
}

std::string TokenTexts::Shown(int32_t id, const std::string& text) const {
  return as_ids_ || !detok_.has_value() ? absl::StrCat("token_id:", id) : text;
}

TokenTexts::Entry TokenTexts::Next(
    int32_t id,
    const google::protobuf::RepeatedPtrField<pdserve::v1::TopLogprob>&
        alternatives) {
  Entry entry;
  for (const auto& alt : alternatives) {
    std::string text;
    if (detok_.has_value()) text = detok_->Peek(alt.token_id()).value_or("");
    entry.alternatives.push_back(Shown(alt.token_id(), text));
  }
  std::string text;
  if (detok_.has_value()) text = detok_->Add(id).value_or("");
  entry.code_points = CodePoints(text);
  entry.token = Shown(id, text);
  return entry;
}

namespace {

json Bytes(const std::string& s) {
  json bytes = json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

json ChatLogprob(const TokenTexts::Entry& texts,
                 const pdserve::v1::GeneratedToken& token) {
  json top = json::array();
  for (int i = 0; i < token.top_logprobs_size(); ++i) {
    const std::string& alt_text = texts.alternatives[i];
    top.push_back({{"token", alt_text},
                   {"logprob", token.top_logprobs(i).logprob()},
                   {"bytes", Bytes(alt_text)}});
  }
  return json{{"token", texts.token},
              {"logprob", token.logprob()},
              {"bytes", Bytes(texts.token)},
              {"top_logprobs", std::move(top)}};
}

json EmptyCompletionLogprobs() {
  return json{{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
}

int64_t CodePoints(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

// Prompt token t's score with at most `alternatives` alternatives; an entry
// without any for the first token (and for ids no score covers).
pdserve::v1::GeneratedToken PromptScore(
    const pdserve::v1::GenerateResponse& msg, int t, int alternatives) {
  pdserve::v1::GeneratedToken scored;
  if (t == 0 || t > msg.prompt_logprobs_size()) {
    scored.set_id(msg.prompt_ids(t));
    return scored;
  }
  scored = msg.prompt_logprobs(t - 1);
  auto* top = scored.mutable_top_logprobs();
  if (top->size() > alternatives) {
    top->DeleteSubrange(alternatives, top->size() - alternatives);
  }
  return scored;
}

bool IsScored(const pdserve::v1::GenerateResponse& msg, int t) {
  return t > 0 && t <= msg.prompt_logprobs_size();
}

}  // namespace

int64_t AppendPromptCompletionLogprobs(const pdserve::v1::GenerateResponse& msg,
                                       int alternatives, TokenTexts* texts,
                                       json* logprobs) {
  int64_t offset = 0;
  for (int t = 0; t < msg.prompt_ids_size(); ++t) {
    const pdserve::v1::GeneratedToken scored =
        PromptScore(msg, t, alternatives);
    const TokenTexts::Entry entry =
        texts->Next(msg.prompt_ids(t), scored.top_logprobs());
    if (IsScored(msg, t)) {
      AppendCompletionLogprob(entry, scored, offset, logprobs);
    } else {
      (*logprobs)["tokens"].push_back(entry.token);
      (*logprobs)["token_logprobs"].push_back(nullptr);
      (*logprobs)["top_logprobs"].push_back(nullptr);
      (*logprobs)["text_offset"].push_back(offset);
    }
    offset += entry.code_points;
  }
  return offset;
}

json VllmPromptLogprobs(const pdserve::v1::GenerateResponse& msg,
                        int alternatives, TokenTexts* texts) {
  json list = json::array();
  for (int t = 0; t < msg.prompt_ids_size(); ++t) {
    const pdserve::v1::GeneratedToken scored =
        PromptScore(msg, t, alternatives);
    const TokenTexts::Entry entry =
        texts->Next(msg.prompt_ids(t), scored.top_logprobs());
    if (!IsScored(msg, t)) {
      list.push_back(nullptr);
      continue;
    }
    json position = json::object();
    position[std::to_string(scored.id())] = {{"logprob", scored.logprob()},
                                             {"rank", scored.rank()},
                                             {"decoded_token", entry.token}};
    for (int i = 0; i < scored.top_logprobs_size(); ++i) {
      const std::string key = std::to_string(scored.top_logprobs(i).token_id());
      if (position.contains(key)) continue;  // the token itself
      position[key] = {{"logprob", scored.top_logprobs(i).logprob()},
                       {"rank", i + 1},
                       {"decoded_token", entry.alternatives[i]}};
    }
    list.push_back(std::move(position));
  }
  return list;
}

void AppendCompletionLogprob(const TokenTexts::Entry& texts,
                             const pdserve::v1::GeneratedToken& token,
                             int64_t offset, json* logprobs) {
  (*logprobs)["tokens"].push_back(texts.token);
  (*logprobs)["token_logprobs"].push_back(token.logprob());
  json top = json::object();
  for (int i = 0; i < token.top_logprobs_size(); ++i) {
    top[texts.alternatives[i]] = token.top_logprobs(i).logprob();
  }
  (*logprobs)["top_logprobs"].push_back(std::move(top));
  (*logprobs)["text_offset"].push_back(offset);
}

void ExtendCompletionLogprobs(const json& more, json* logprobs) {
  for (const char* list :
       {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const json& v : more[list]) (*logprobs)[list].push_back(v);
  }
}

}  // namespace pdserve::openai
