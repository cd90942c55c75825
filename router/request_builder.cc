#include "router/request_builder.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "common/model/model_source.h"

namespace pdserve {
namespace {

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

constexpr char kFieldPayload[] = "type.pdserve/invalid_field";
constexpr char kReasonPayload[] = "type.pdserve/invalid_reason";

// INVALID_ARGUMENT naming the request field it is about (InvalidField).
absl::Status Invalid(absl::string_view field, const std::string& message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kFieldPayload, absl::Cord(field));
  return s;
}

// A request longer than the model's context, said as OpenAI and vLLM say
// it: clients (LiteLLM, LangChain) recognise "maximum context length" and
// the reason "context_length_exceeded" and shorten the input.
absl::Status ContextLengthExceeded(absl::string_view field, bool chat,
                                   int prompt_len, int max_tokens,
                                   int max_context) {
  const char* input = chat ? "messages" : "prompt";
  std::string message =
      max_tokens > 0
          ? absl::StrCat("This model's maximum context length is ", max_context,
                         " tokens. However, you requested ",
                         int64_t{prompt_len} + max_tokens, " tokens (",
                         prompt_len, " in the ", input, ", ", max_tokens,
                         " in the completion). Please reduce the length of "
                         "the ",
                         input, " or completion.")
          : absl::StrCat("This model's maximum context length is ", max_context,
                         " tokens. However, the ", input,
                         chat ? " have " : " has ", prompt_len,
                         " tokens, which leaves none to generate. Please "
                         "reduce the length of the ",
                         input, ".");
  absl::Status s = Invalid(field, message);
  s.SetPayload(kReasonPayload, absl::Cord("context_length_exceeded"));
  return s;
}

}  // namespace

std::string InvalidField(const absl::Status& status) {
  auto field = status.GetPayload(kFieldPayload);
  return field.has_value() ? std::string(*field) : std::string();
}

std::string InvalidReason(const absl::Status& status) {
  auto reason = status.GetPayload(kReasonPayload);
  return reason.has_value() ? std::string(*reason) : std::string();
}

absl::StatusOr<RouterModelInfo> LoadRouterModelInfo(const std::string& model) {
  RouterModelInfo info;
  info.name = model;
  ModelConfig config;
  GenerationConfig gen;
  if (absl::StartsWith(model, "synthetic:")) {
    auto c = SyntheticConfig(model.substr(10));
    if (!c.ok()) return c.status();
    config = *c;
    gen.eos_token_ids = config.eos_token_ids;
    gen.bos_token_id = config.bos_token_id;
  } else {
    auto text = ReadText(model + "/config.json");
    if (!text.ok()) return text.status();
    auto c = ParseModelConfig(*text, model + "/config.json");
    if (!c.ok()) return c.status();
    config = *c;
    auto gtext = ReadText(model + "/generation_config.json");
    if (gtext.ok()) {
      auto g = ParseGenerationConfig(*gtext, model + "/generation_config.json",
                                     config);
      if (!g.ok()) return g.status();
      gen = *g;
    } else {
      gen.eos_token_ids = config.eos_token_ids;
      gen.bos_token_id = config.bos_token_id;
    }
  }
  info.vocab_size = config.vocab_size;
  info.max_context = config.max_position_embeddings;
  info.eos_ids = gen.eos_token_ids;
  info.bos_id = gen.bos_token_id;
  return info;
}

absl::StatusOr<RenderedChat> RenderChat(const pdserve::v1::ChatInput& chat,
                                        const ChatSupport& support,
                                        const Tokenizer* tokenizer) {
  if (support.templates == nullptr) return support.unavailable;
  if (tokenizer == nullptr) {
    return absl::FailedPreconditionError(
        "this router has no tokenizer: chat input needs one");
  }
  using ojson = nlohmann::ordered_json;
  auto parse = [](const std::string& text,
                  const std::string& what) -> absl::StatusOr<ojson> {
    ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return Invalid("chat", absl::StrCat(what, " is not valid JSON"));
    }
    return j;
  };
  if (chat.messages_size() == 0)
    return Invalid("chat", "chat input has no messages");
  ChatTemplateInput in;
  in.messages = ojson::array();
  for (int i = 0; i < chat.messages_size(); ++i) {
    const pdserve::v1::ChatMessage& m = chat.messages(i);
    if (m.role().empty()) {
      return Invalid("chat", absl::StrCat("messages[", i, "] has no role"));
    }
    ojson msg = ojson::object();
    msg["role"] = m.role();
    msg["content"] = m.has_content() ? ojson(m.content()) : ojson(nullptr);
    if (m.has_name()) msg["name"] = m.name();
    if (m.has_tool_call_id()) msg["tool_call_id"] = m.tool_call_id();
    if (!m.tool_calls_json().empty()) {
      auto calls = parse(m.tool_calls_json(),
                         absl::StrCat("messages[", i, "].tool_calls_json"));
      if (!calls.ok()) return calls.status();
      if (!calls->is_array()) {
        return Invalid(
            "chat",
            absl::StrCat("messages[", i, "].tool_calls_json must be a list"));
      }
      msg["tool_calls"] = *std::move(calls);
    }
    in.messages.push_back(std::move(msg));
  }
  in.continue_final_message = chat.continue_final_message();
  // Continuing the final message implies no generation prompt unless the
  // client asked for both (which the template input refuses).
  in.add_generation_prompt = chat.has_add_generation_prompt()
                                 ? chat.add_generation_prompt()
                                 : !chat.continue_final_message();
  if (!chat.tools_json().empty()) {
    auto tools = parse(chat.tools_json(), "tools_json");
    if (!tools.ok()) return tools.status();
    if (!tools->is_array())
      return Invalid("tools", "tools_json must be a list");
    if (!tools->empty()) in.tools = *std::move(tools);
  }
  if (!chat.chat_template_kwargs_json().empty()) {
    auto kwargs =
        parse(chat.chat_template_kwargs_json(), "chat_template_kwargs_json");
    if (!kwargs.ok()) return kwargs.status();
    if (!kwargs->is_object()) {
      return Invalid("chat", "chat_template_kwargs_json must be an object");
    }
    in.kwargs = *std::move(kwargs);
  }
  support.templates->ApplySpecialTokens(&in);
  auto tmpl = support.templates->SelectOrError(!in.tools.is_null());
  if (!tmpl.ok()) return tmpl.status();
  auto text = (*tmpl)->Render(in);
  if (!text.ok()) return Invalid("chat", std::string(text.status().message()));
  RenderedChat out;
  out.text = *std::move(text);
  auto ids = tokenizer->Encode(out.text, /*add_special_tokens=*/false);
  if (!ids.ok()) {
    return Invalid("chat",
                   absl::StrCat("cannot tokenize the rendered conversation: ",
                                ids.status().message()));
  }
  out.ids = *std::move(ids);
  return out;
}

absl::StatusOr<ResolvedRequest> ResolveRequest(
    const pdserve::v1::GenerateRequest& request, const Tokenizer* tokenizer,
    const ChatSupport& chat, const RouterModelInfo& model,
    const RequestLimits& limits) {
  ResolvedRequest out;
  if (request.ByteSizeLong() > static_cast<size_t>(limits.max_request_bytes)) {
    return Invalid("", absl::StrCat("request is ", request.ByteSizeLong(),
                                    " bytes, more than the limit of ",
                                    limits.max_request_bytes));
  }
  if (request.request_id().size() > 256) {
    return Invalid("request_id", "request_id longer than 256 bytes");
  }
  // Prompt.
  switch (request.input_case()) {
    case pdserve::v1::GenerateRequest::kText: {
      // "" is a prompt: the BOS the tokenizer adds (as in transformers and
      // vLLM); only a text that yields no token at all is refused below.
      if (tokenizer == nullptr) {
        return absl::FailedPreconditionError(
            "this router has no tokenizer (its --model has none): send token "
            "ids (gRPC token_ids, `pdserve generate --prompt_ids`, or "
            "OpenAI's token-id prompt)");
      }
      auto ids =
          tokenizer->Encode(request.text(), request.has_add_special_tokens()
                                                ? request.add_special_tokens()
                                                : true);
      if (!ids.ok()) {
        return Invalid("prompt", absl::StrCat("cannot tokenize the prompt: ",
                                              ids.status().message()));
      }
      out.prompt_ids = *std::move(ids);
      if (out.prompt_ids.empty()) {
        return Invalid("prompt",
                       "empty prompt: the text yields no tokens to run");
      }
      break;
    }
    case pdserve::v1::GenerateRequest::kTokenIds:
      out.prompt_ids.assign(request.token_ids().ids().begin(),
                            request.token_ids().ids().end());
      if (out.prompt_ids.empty())
        return Invalid("prompt", "empty prompt: no token ids");
      for (int32_t id : out.prompt_ids) {
        if (id < 0 || id >= model.vocab_size) {
          return Invalid("prompt",
                         absl::StrCat("prompt token id ", id,
                                      " is outside the vocabulary [0, ",
                                      model.vocab_size, ")"));
        }
      }
      break;
    case pdserve::v1::GenerateRequest::kChat: {
      auto rendered = RenderChat(request.chat(), chat, tokenizer);
      if (!rendered.ok()) return rendered.status();
      out.prompt_ids = std::move(rendered->ids);
      if (out.prompt_ids.empty()) {
        return Invalid("chat",
                       "empty prompt: the rendered conversation has no tokens");
      }
      break;
    }
    default:
      return Invalid("prompt", "empty prompt: set text, token_ids or chat");
  }
  const int prompt_len = static_cast<int>(out.prompt_ids.size());
  const bool is_chat =
      request.input_case() == pdserve::v1::GenerateRequest::kChat;
  if (prompt_len > limits.max_prompt_tokens) {
    return Invalid("prompt", absl::StrCat("prompt has ", prompt_len,
                                          " tokens, more than the limit of ",
                                          limits.max_prompt_tokens));
  }
  // Length.
  int max_tokens = limits.default_max_tokens;
  if (request.has_max_tokens()) {
    max_tokens = request.max_tokens();
    // 0: the prompt alone, computed and scored (prompt_logprobs).
    if (max_tokens < 0 || (max_tokens == 0 && !request.has_prompt_logprobs())) {
      return Invalid("max_tokens",
                     absl::StrCat("max_tokens must be positive (0 only with "
                                  "prompt_logprobs: the prompt scored alone), "
                                  "got ",
                                  max_tokens));
    }
    // Beyond the context, say so first: clients (LiteLLM, LangChain) act
    // on context_length_exceeded, not on the router's own cap.
    if (max_tokens > limits.max_tokens_cap &&
        int64_t{prompt_len} + max_tokens <= model.max_context) {
      return Invalid("max_tokens", absl::StrCat("max_tokens ", max_tokens,
                                                " is above the limit of ",
                                                limits.max_tokens_cap));
    }
  } else {
    max_tokens = std::min(max_tokens, model.max_context - prompt_len);
    if (max_tokens <= 0) {
      return ContextLengthExceeded("prompt", is_chat, prompt_len, 0,
                                   model.max_context);
    }
  }
  if (int64_t{prompt_len} + max_tokens > model.max_context) {
    return ContextLengthExceeded("max_tokens", is_chat, prompt_len, max_tokens,
                                 model.max_context);
  }
  out.stop.max_tokens = max_tokens;
  if (request.has_min_tokens()) {
    if (request.min_tokens() < 0 || request.min_tokens() > max_tokens) {
      return Invalid("min_tokens",
                     absl::StrCat("min_tokens must be in [0, max_tokens = ",
                                  max_tokens, "], got ", request.min_tokens()));
    }
    out.stop.min_tokens = request.min_tokens();
  }
  out.stop.ignore_eos = request.has_ignore_eos() && request.ignore_eos();
  if (request.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Invalid("stop_token_ids",
                   absl::StrCat("more than ", limits.max_stop_token_ids,
                                " stop token ids"));
  }
  for (int32_t id : request.stop_token_ids()) {
    if (id < 0 || id >= model.vocab_size) {
      return Invalid(
          "stop_token_ids",
          absl::StrCat("unknown stop token id ", id, " (vocabulary has ",
                       model.vocab_size, " tokens)"));
    }
    out.stop.stop_token_ids.push_back(id);
  }
  if (request.stop_size() > limits.max_stop_strings) {
    return Invalid("stop",
                   absl::StrCat("too many stop strings (", request.stop_size(),
                                ", limit ", limits.max_stop_strings, ")"));
  }
  for (const std::string& s : request.stop()) {
    if (s.empty()) return Invalid("stop", "empty stop string");
    if (static_cast<int>(s.size()) > limits.max_stop_string_bytes) {
      return Invalid("stop",
                     absl::StrCat("stop string longer than ",
                                  limits.max_stop_string_bytes, " bytes"));
    }
    if (tokenizer == nullptr) {
      return absl::FailedPreconditionError(
          "this router has no tokenizer: stop strings are not available");
    }
    out.stop_strings.push_back(s);
  }
  // Sampling.
  const auto& sp = request.sampling();
  SamplingParams& s = out.sampling;
  if (sp.has_temperature()) s.temperature = sp.temperature();
  if (sp.has_top_p()) s.top_p = sp.top_p();
  if (sp.has_top_k()) s.top_k = sp.top_k();
  if (sp.has_min_p()) s.min_p = sp.min_p();
  if (sp.has_repetition_penalty())
    s.repetition_penalty = sp.repetition_penalty();
  if (sp.has_presence_penalty()) s.presence_penalty = sp.presence_penalty();
  if (sp.has_frequency_penalty()) s.frequency_penalty = sp.frequency_penalty();
  if (sp.has_seed()) s.seed = sp.seed();
  if (!std::isfinite(s.temperature) || s.temperature < 0) {
    return Invalid("temperature", absl::StrCat("temperature must be >= 0, got ",
                                               s.temperature));
  }
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return Invalid("top_p",
                   absl::StrCat("top_p must be in (0, 1], got ", s.top_p));
  }
  if (s.top_k < 0)
    return Invalid("top_k", absl::StrCat("top_k must be >= 0, got ", s.top_k));
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) {
    return Invalid("min_p",
                   absl::StrCat("min_p must be in [0, 1], got ", s.min_p));
  }
  if (!(s.repetition_penalty > 0.0f) || !std::isfinite(s.repetition_penalty)) {
    return Invalid("repetition_penalty",
                   absl::StrCat("repetition_penalty must be > 0, got ",
                                s.repetition_penalty));
  }
  // OpenAI's range (vLLM refuses beyond it too).
  if (!(s.presence_penalty >= -2.0f && s.presence_penalty <= 2.0f)) {
    return Invalid("presence_penalty",
                   absl::StrCat("presence_penalty must be in [-2, 2], got ",
                                s.presence_penalty));
  }
  if (!(s.frequency_penalty >= -2.0f && s.frequency_penalty <= 2.0f)) {
    return Invalid("frequency_penalty",
                   absl::StrCat("frequency_penalty must be in [-2, 2], got ",
                                s.frequency_penalty));
  }
  if (request.has_top_logprobs()) {
    if (request.top_logprobs() < 0 ||
        request.top_logprobs() > limits.max_top_logprobs) {
      return Invalid(
          "top_logprobs",
          absl::StrCat("top_logprobs must be in [0, ", limits.max_top_logprobs,
                       "], got ", request.top_logprobs()));
    }
    s.top_logprobs = request.top_logprobs();
    out.logprobs = true;
  }
  if (sp.logit_bias_size() > limits.max_logit_bias) {
    return Invalid("logit_bias",
                   absl::StrCat("logit_bias has ", sp.logit_bias_size(),
                                " entries, more than the limit of ",
                                limits.max_logit_bias));
  }
  for (const auto& [id, bias] : sp.logit_bias()) {
    if (id < 0 || id >= model.vocab_size) {
      return Invalid("logit_bias",
                     absl::StrCat("logit_bias token id ", id,
                                  " is outside the vocabulary [0, ",
                                  model.vocab_size, ")"));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return Invalid("logit_bias",
                     absl::StrCat("logit_bias of token ", id,
                                  " must be in [-100, 100], got ", bias));
    }
    s.logit_bias.emplace_back(id, bias);
  }
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  absl::Status valid = ValidateSamplingParams(s);
  if (!valid.ok()) return Invalid("", std::string(valid.message()));
  out.skip_special_tokens =
      request.has_skip_special_tokens() ? request.skip_special_tokens() : true;
  out.include_stop_str_in_output = request.include_stop_str_in_output();
  if (request.has_prompt_logprobs()) {
    if (request.prompt_logprobs() < 0 || request.prompt_logprobs() > 100) {
      return Invalid("prompt_logprobs",
                     absl::StrCat("prompt_logprobs must be in [0, 100], got ",
                                  request.prompt_logprobs()));
    }
    out.prompt_logprobs = request.prompt_logprobs();
  }
  return out;
}

}  // namespace pdserve
