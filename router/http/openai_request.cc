#include "router/http/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pdserve::openai {

namespace v1 = ::pdserve::v1;
using nlohmann::json;

namespace {

// Reads the fields of one JSON object, recording the first error.
class Fields {
 public:
  Fields(const json& body, RequestError* error) : body_(body), error_(error) {}

  bool ok() const { return error_->status.ok(); }
  bool Has(const char* name) const {
    return body_.contains(name) && !body_[name].is_null();
  }
  const json& Get(const char* name) const { return body_[name]; }

  bool Fail(const std::string& param, const std::string& message) {
    if (ok()) {
      error_->status = absl::InvalidArgumentError(message);
      error_->param = param;
    }
    return false;
  }

  std::optional<bool> Bool(const char* name) {
    if (!Has(name)) return std::nullopt;
    if (!Get(name).is_boolean()) {
      Fail(name, absl::StrCat("'", name, "' must be a boolean"));
      return std::nullopt;
    }
    return Get(name).get<bool>();
  }
  std::optional<double> Number(const char* name) {
    if (!Has(name)) return std::nullopt;
    if (!Get(name).is_number()) {
      Fail(name, absl::StrCat("'", name, "' must be a number"));
      return std::nullopt;
    }
    const double v = Get(name).get<double>();
    if (!std::isfinite(v)) {
      Fail(name, absl::StrCat("'", name, "' must be finite"));
      return std::nullopt;
    }
    return v;
  }
  std::optional<int64_t> Int(const char* name, int64_t lo, int64_t hi) {
    if (!Has(name)) return std::nullopt;
    const json& v = Get(name);
    if (!v.is_number_integer() &&
        !(v.is_number_float() &&
          std::floor(v.get<double>()) == v.get<double>())) {
      Fail(name, absl::StrCat("'", name, "' must be an integer"));
      return std::nullopt;
    }
    const double d = v.get<double>();
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
      Fail(name, absl::StrCat("'", name, "' must be in [", lo, ", ", hi,
                              "], got ", v.dump()));
      return std::nullopt;
    }
    return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(d);
  }
  std::optional<std::string> String(const char* name) {
    if (!Has(name)) return std::nullopt;
    if (!Get(name).is_string()) {
      Fail(name, absl::StrCat("'", name, "' must be a string"));
      return std::nullopt;
    }
    return Get(name).get<std::string>();
  }

  // A field that would change the output in a way this server does not
  // implement: refused rather than ignored.
  void Unsupported(const char* name, const std::string& why) {
    if (Has(name)) {
      Fail(name, absl::StrCat("'", name, "' is not supported: ", why));
    }
  }

 private:
  const json& body_;
  RequestError* error_;
};

// Asks the pipeline to score the prompt with at least `alternatives`
// alternatives (echo with logprobs and prompt_logprobs may both ask).
void ScorePrompt(int alternatives, v1::GenerateRequest& proto) {
  proto.set_prompt_logprobs(std::max(proto.prompt_logprobs(), alternatives));
}

// The fields chat and completions share: length, sampling, stopping, n,
// streaming. Fills `parsed` and `proto` (the template of every prompt).
void ReadCommon(Fields& f, ParsedRequest& parsed, v1::GenerateRequest& proto) {
  if (auto model = f.String("model")) parsed.model = *model;
  if (auto stream = f.Bool("stream")) parsed.stream = *stream;
  if (f.Has("stream_options")) {
    const json& so = f.Get("stream_options");
    if (!so.is_object()) {
      f.Fail("stream_options", "'stream_options' must be an object");
    } else if (!parsed.stream) {
      f.Fail("stream_options",
             "'stream_options' is only allowed when 'stream' is true");
    } else {
      if (so.contains("include_usage") && !so["include_usage"].is_null()) {
        if (!so["include_usage"].is_boolean()) {
          f.Fail("stream_options.include_usage",
                 "'stream_options.include_usage' must be a boolean");
        } else {
          parsed.include_usage = so["include_usage"].get<bool>();
        }
      }
    }
  }
  if (auto n = f.Int("n", 1, kMaxChoices)) parsed.n = static_cast<int>(*n);
  // max_completion_tokens (the newer name) wins over max_tokens.
  std::optional<int64_t> max_tokens =
      f.Int("max_tokens", std::numeric_limits<int32_t>::min(),
            std::numeric_limits<int32_t>::max());
  if (auto mct =
          f.Int("max_completion_tokens", std::numeric_limits<int32_t>::min(),
                std::numeric_limits<int32_t>::max())) {
    max_tokens = mct;
  }
  if (max_tokens.has_value()) {
    proto.set_max_tokens(static_cast<int32_t>(*max_tokens));
  }
  auto* s = proto.mutable_sampling();
  if (auto v = f.Number("temperature"))
    s->set_temperature(static_cast<float>(*v));
  if (auto v = f.Number("top_p")) s->set_top_p(static_cast<float>(*v));
  if (auto v = f.Int("top_k", -1, std::numeric_limits<int32_t>::max())) {
    s->set_top_k(*v < 0 ? 0 : static_cast<int32_t>(*v));  // vLLM: -1 = off
  }
  if (auto v = f.Number("min_p")) s->set_min_p(static_cast<float>(*v));
  if (auto v = f.Number("presence_penalty")) {
    s->set_presence_penalty(static_cast<float>(*v));
  }
  if (auto v = f.Number("frequency_penalty")) {
    s->set_frequency_penalty(static_cast<float>(*v));
  }
  if (auto v = f.Number("repetition_penalty")) {
    s->set_repetition_penalty(static_cast<float>(*v));
  }
  if (auto v = f.Int("seed", std::numeric_limits<int64_t>::min(),
                     std::numeric_limits<int64_t>::max())) {
    parsed.seed = static_cast<uint64_t>(*v);
  }
  if (f.Has("stop")) {
    const json& stop = f.Get("stop");
    if (stop.is_string()) {
      proto.add_stop(stop.get<std::string>());
    } else if (stop.is_array()) {
      for (const json& s : stop) {
        if (!s.is_string()) {
          f.Fail("stop", "'stop' must be a string or a list of strings");
          break;
        }
        proto.add_stop(s.get<std::string>());
      }
    } else {
      f.Fail("stop", "'stop' must be a string or a list of strings");
    }
  }
  if (f.Has("stop_token_ids")) {
    const json& ids = f.Get("stop_token_ids");
    if (!ids.is_array()) {
      f.Fail("stop_token_ids", "'stop_token_ids' must be a list of integers");
    } else {
      for (const json& id : ids) {
        if (!id.is_number_integer() ||
            id.get<int64_t>() > std::numeric_limits<int32_t>::max() ||
            id.get<int64_t>() < std::numeric_limits<int32_t>::min()) {
          f.Fail("stop_token_ids",
                 "'stop_token_ids' must be a list of integers");
          break;
        }
        proto.add_stop_token_ids(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
  }
  if (auto v = f.Bool("ignore_eos")) proto.set_ignore_eos(*v);
  if (auto v = f.Int("min_tokens", 0, std::numeric_limits<int32_t>::max())) {
    proto.set_min_tokens(static_cast<int32_t>(*v));
  }
  if (auto v = f.Bool("return_tokens_as_token_ids")) parsed.tokens_as_ids = *v;
  if (auto v = f.Int("prompt_logprobs", 0, 20)) {
    if (parsed.stream) {
      f.Fail("prompt_logprobs",
             "'prompt_logprobs' is not available with 'stream': true (as in "
             "vLLM); use a non-streamed request, or 'echo' with 'logprobs' "
             "on /v1/completions");
    }
    parsed.prompt_logprobs = static_cast<int>(*v);
    ScorePrompt(parsed.prompt_logprobs.value(), proto);
  }
  if (auto v = f.Bool("skip_special_tokens")) proto.set_skip_special_tokens(*v);
  if (auto v = f.Bool("include_stop_str_in_output")) {
    proto.set_include_stop_str_in_output(*v);
  }
  (void)f.String("user");  // accepted, not used
  if (f.Has("logit_bias")) {
    // {"token id": bias}: the ids as strings (JSON keys), as OpenAI takes
    // them; the pipeline checks ranges and the vocabulary.
    const json& biases = f.Get("logit_bias");
    if (!biases.is_object()) {
      f.Fail("logit_bias",
             "'logit_bias' must be an object of token id -> bias");
    } else {
      for (const auto& [key, value] : biases.items()) {
        int32_t id = 0;
        if (!absl::SimpleAtoi(key, &id)) {
          f.Fail("logit_bias",
                 absl::StrCat("'logit_bias' keys must be token ids, got \"",
                              key, "\""));
          break;
        }
        if (!value.is_number() || !std::isfinite(value.get<double>())) {
          f.Fail("logit_bias", absl::StrCat("'logit_bias' of token ", key,
                                            " must be a number"));
          break;
        }
        (*s->mutable_logit_bias())[id] =
            static_cast<float>(value.get<double>());
      }
    }
  }
  if (f.Has("response_format")) {
    const json& rf = f.Get("response_format");
    if (!(rf.is_object() && rf.value("type", "") == "text")) {
      f.Fail("response_format",
             "'response_format' is not supported: only {\"type\": \"text\"} "
             "(structured output is not implemented)");
    }
  }
  f.Unsupported("guided_json", "structured output is not implemented");
  f.Unsupported("guided_regex", "structured output is not implemented");
  f.Unsupported("guided_choice", "structured output is not implemented");
  f.Unsupported("guided_grammar", "structured output is not implemented");
}

// A message's content as the template sees it: a string, or the text parts
// of an array joined with "\n" (vLLM's "string" content format); null stays
// unset (None).
bool ReadContent(Fields& f, const json& content, const std::string& where,
                 v1::ChatMessage* msg) {
  if (content.is_null()) return true;
  if (content.is_string()) {
    msg->set_content(content.get<std::string>());
    return true;
  }
  if (!content.is_array()) {
    return f.Fail(where, absl::StrCat("'", where,
                                      "' must be a string, a list of content "
                                      "parts or null"));
  }
  std::string text;
  bool first = true;
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") ||
        !part["type"].is_string()) {
      return f.Fail(where, absl::StrCat("each part of '", where,
                                        "' must be an object with a 'type'"));
    }
    const std::string type = part["type"].get<std::string>();
    if (type != "text") {
      return f.Fail(where, absl::StrCat("content part type '", type,
                                        "' is not supported (text only)"));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return f.Fail(where, absl::StrCat("a text part of '", where,
                                        "' needs a string 'text'"));
    }
    if (!first) text += "\n";
    text += part["text"].get<std::string>();
    first = false;
  }
  msg->set_content(std::move(text));
  return true;
}

bool ReadMessages(Fields& f, v1::ChatInput* chat) {
  if (!f.Has("messages")) return f.Fail("messages", "'messages' is required");
  const json& messages = f.Get("messages");
  if (!messages.is_array() || messages.empty()) {
    return f.Fail("messages", "'messages' must be a non-empty list");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object())
      return f.Fail(where, absl::StrCat("'", where, "' must be an object"));
    if (!m.contains("role") || !m["role"].is_string()) {
      return f.Fail(where + ".role",
                    absl::StrCat("'", where, ".role' must be a string"));
    }
    v1::ChatMessage* msg = chat->add_messages();
    msg->set_role(m["role"].get<std::string>());
    if (m.contains("content") &&
        !ReadContent(f, m["content"], where + ".content", msg)) {
      return false;
    }
    for (const char* key : {"name", "tool_call_id"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string()) {
        return f.Fail(absl::StrCat(where, ".", key),
                      absl::StrCat("'", where, ".", key, "' must be a string"));
      }
      if (std::string(key) == "name") {
        msg->set_name(m[key].get<std::string>());
      } else {
        msg->set_tool_call_id(m[key].get<std::string>());
      }
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array()) {
        return f.Fail(where + ".tool_calls",
                      absl::StrCat("'", where, ".tool_calls' must be a list"));
      }
      msg->set_tool_calls_json(m["tool_calls"].dump());
    }
  }
  return true;
}

}  // namespace

uint64_t ChoiceSeed(uint64_t seed, int index) {
  return seed + static_cast<uint64_t>(index);
}

std::optional<ParsedRequest> ParseChatRequest(const json& body,
                                              RequestError* error) {
  *error = RequestError{};
  if (!body.is_object()) {
    error->status =
        absl::InvalidArgumentError("the body must be a JSON object");
    return std::nullopt;
  }
  Fields f(body, error);
  ParsedRequest parsed;
  parsed.endpoint = Endpoint::kChat;
  v1::GenerateRequest proto;
  ReadCommon(f, parsed, proto);
  v1::ChatInput* chat = proto.mutable_chat();
  ReadMessages(f, chat);
  if (auto v = f.Bool("add_generation_prompt"))
    chat->set_add_generation_prompt(*v);
  if (auto v = f.Bool("continue_final_message"))
    chat->set_continue_final_message(*v);
  if (f.Has("chat_template_kwargs")) {
    if (!f.Get("chat_template_kwargs").is_object()) {
      f.Fail("chat_template_kwargs",
             "'chat_template_kwargs' must be an object");
    } else {
      chat->set_chat_template_kwargs_json(f.Get("chat_template_kwargs").dump());
    }
  }
  if (f.Has("tools")) {
    if (!f.Get("tools").is_array()) {
      f.Fail("tools", "'tools' must be a list");
    } else if (!f.Get("tools").empty()) {
      chat->set_tools_json(f.Get("tools").dump());
    }
  }
  if (f.Has("tool_choice")) {
    const json& tc = f.Get("tool_choice");
    if (!(tc.is_string() && (tc == "none" || tc == "auto"))) {
      f.Fail("tool_choice",
             "'tool_choice' is not supported beyond \"none\" and \"auto\" "
             "(forced tool calls need structured output)");
    }
  }
  f.Unsupported("functions", "use 'tools' (passed to the chat template)");
  f.Unsupported("function_call", "use 'tools' (passed to the chat template)");
  if (auto v = f.Bool("logprobs")) parsed.logprobs = *v;
  if (auto v = f.Int("top_logprobs", 0, 20)) {
    if (!parsed.logprobs && *v > 0) {
      f.Fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    parsed.top_logprobs = static_cast<int>(*v);
  }
  if (!f.ok()) return std::nullopt;
  // Set even at 0: the router then sends the prompt's ids first, for the
  // token texts in context (openai_response.h TokenTexts).
  if (parsed.logprobs) proto.set_top_logprobs(parsed.top_logprobs);
  parsed.prompts.push_back(std::move(proto));
  parsed.prompt_texts.emplace_back(std::nullopt);
  return parsed;
}

std::optional<ParsedRequest> ParseCompletionRequest(const json& body,
                                                    RequestError* error) {
  *error = RequestError{};
  if (!body.is_object()) {
    error->status =
        absl::InvalidArgumentError("the body must be a JSON object");
    return std::nullopt;
  }
  Fields f(body, error);
  ParsedRequest parsed;
  parsed.endpoint = Endpoint::kCompletions;
  v1::GenerateRequest proto;
  ReadCommon(f, parsed, proto);
  // Unset (or null): OpenAI's default for this endpoint, as vLLM's.
  if (!proto.has_max_tokens()) {
    proto.set_max_tokens(kCompletionsDefaultMaxTokens);
  }
  if (auto v = f.Bool("echo")) parsed.echo = *v;
  if (auto v = f.Int("logprobs", 0, 20)) {
    parsed.logprobs = true;
    parsed.top_logprobs = static_cast<int>(*v);
  }
  // echo with max_tokens 0 (vLLM's echo without generation): the pipeline's
  // prompt-only request, which computes and scores the prompt alone.
  if (parsed.echo && proto.has_max_tokens() && proto.max_tokens() == 0) {
    ScorePrompt(0, proto);
  }
  if (f.Has("suffix")) {
    const json& suffix = f.Get("suffix");
    if (!(suffix.is_string() && suffix.get<std::string>().empty())) {
      f.Fail("suffix", "'suffix' is not supported (no fill-in-the-middle)");
    }
  }
  if (auto best_of = f.Int("best_of", 1, kMaxChoices)) {
    if (*best_of > parsed.n) {
      f.Fail("best_of",
             "'best_of' greater than 'n' is not supported (no server-side "
             "ranking of candidates)");
    }
  }
  // Set even at 0: the router then sends the prompt's ids first, for the
  // token texts in context (openai_response.h TokenTexts).
  if (parsed.logprobs) proto.set_top_logprobs(parsed.top_logprobs);
  // echo with logprobs scores the prompt's tokens too (lm-eval-harness's
  // loglikelihood requests), with as many alternatives.
  if (parsed.echo && parsed.logprobs) ScorePrompt(parsed.top_logprobs, proto);
  // prompt: a string, a list of strings, a list of token ids, or a list of
  // such lists.
  if (!f.Has("prompt")) {
    f.Fail("prompt", "'prompt' is required");
    return std::nullopt;
  }
  const json& prompt = f.Get("prompt");
  auto add_text = [&](const std::string& text) {
    v1::GenerateRequest p = proto;
    p.set_text(text);
    parsed.prompts.push_back(std::move(p));
    parsed.prompt_texts.emplace_back(text);
  };
  auto add_ids = [&](const json& ids) -> bool {
    v1::GenerateRequest p = proto;
    auto* out = p.mutable_token_ids();
    for (const json& id : ids) {
      if (!id.is_number_integer() ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max() ||
          id.get<int64_t>() < std::numeric_limits<int32_t>::min()) {
        return f.Fail("prompt", "token-id prompts must hold integers");
      }
      out->add_ids(static_cast<int32_t>(id.get<int64_t>()));
    }
    parsed.prompts.push_back(std::move(p));
    parsed.prompt_texts.emplace_back(std::nullopt);
    return true;
  };
  if (prompt.is_string()) {
    add_text(prompt.get<std::string>());
  } else if (prompt.is_array() && !prompt.empty()) {
    if (prompt[0].is_string()) {
      for (const json& p : prompt) {
        if (!p.is_string()) {
          f.Fail("prompt", "a list of prompts must hold only strings");
          break;
        }
        add_text(p.get<std::string>());
      }
    } else if (prompt[0].is_number()) {
      add_ids(prompt);
    } else if (prompt[0].is_array()) {
      for (const json& p : prompt) {
        if (!p.is_array()) {
          f.Fail("prompt", "a list of token-id prompts must hold only lists");
          break;
        }
        if (!add_ids(p)) break;
      }
    } else {
      f.Fail("prompt",
             "'prompt' must be a string, a list of strings, a list of token "
             "ids or a list of such lists");
    }
  } else {
    f.Fail("prompt",
           prompt.is_array()
               ? "'prompt' is an empty list"
               : "'prompt' must be a string, a list of strings, a list of "
                 "token ids or a list of such lists");
  }
  if (f.ok() &&
      static_cast<int>(parsed.prompts.size()) * parsed.n > kMaxChoices) {
    f.Fail("n",
           absl::StrCat("prompts x n is ", parsed.prompts.size() * parsed.n,
                        ", more than the limit of ", kMaxChoices));
  }
  if (!f.ok()) return std::nullopt;
  return parsed;
}

}  // namespace pdserve::openai
