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
    headers.emplace_back(
        "Retry-After",
        std::to_string((std::max(*retry_after_ms, 1) + 999) / 1000));
  }
  responder.Send(http_status, "application/json",
                 DumpJson(ErrorJson(http_status, message, param, code)),
                 std::move(headers));
}

std::string OpenAiFinishReason(const std::string& reason) {
  return reason == "length" ? "length" : "stop";
}

std::string TokenText(const Tokenizer* tokenizer, int32_t id, bool as_id) {
  if (as_id || tokenizer == nullptr) return absl::StrCat("token_id:", id);
  auto text = tokenizer->Decode({id}, /*skip_special_tokens=*/false);
  return text.ok() ? *text : "";
}

namespace {

json Bytes(const std::string& s) {
  json bytes = json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

json ChatLogprob(const Tokenizer* tokenizer,
                 const pdserve::v1::GeneratedToken& token, bool as_ids) {
  const std::string text = TokenText(tokenizer, token.id(), as_ids);
  json top = json::array();
  for (const auto& alt : token.top_logprobs()) {
    const std::string alt_text = TokenText(tokenizer, alt.token_id(), as_ids);
    top.push_back({{"token", alt_text},
                   {"logprob", alt.logprob()},
                   {"bytes", Bytes(alt_text)}});
  }
  return json{{"token", text},
              {"logprob", token.logprob()},
              {"bytes", Bytes(text)},
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

int64_t AppendPromptCompletionLogprobs(const Tokenizer* tokenizer,
                                       const pdserve::v1::GenerateResponse& msg,
                                       bool as_ids, json* logprobs) {
  int64_t offset = 0;
  for (int t = 0; t < msg.prompt_ids_size(); ++t) {
    const int32_t id = msg.prompt_ids(t);
    if (t == 0 || t > msg.prompt_logprobs_size()) {
      (*logprobs)["tokens"].push_back(TokenText(tokenizer, id, as_ids));
      (*logprobs)["token_logprobs"].push_back(nullptr);
      (*logprobs)["top_logprobs"].push_back(nullptr);
      (*logprobs)["text_offset"].push_back(offset);
    } else {
      AppendCompletionLogprob(tokenizer, msg.prompt_logprobs(t - 1), as_ids,
                              offset, logprobs);
    }
    offset += CodePoints(TokenText(tokenizer, id, /*as_id=*/false));
  }
  return offset;
}

void AppendCompletionLogprob(const Tokenizer* tokenizer,
                             const pdserve::v1::GeneratedToken& token,
                             bool as_ids, int64_t offset, json* logprobs) {
  (*logprobs)["tokens"].push_back(TokenText(tokenizer, token.id(), as_ids));
  (*logprobs)["token_logprobs"].push_back(token.logprob());
  json top = json::object();
  for (const auto& alt : token.top_logprobs()) {
    top[TokenText(tokenizer, alt.token_id(), as_ids)] = alt.logprob();
  }
  (*logprobs)["top_logprobs"].push_back(std::move(top));
  (*logprobs)["text_offset"].push_back(offset);
}

}  // namespace pdserve::openai
