#include "common/chat_template/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/chat_template/evaluator.h"
#include "common/chat_template/parser.h"
#include "common/chat_template/text.h"
#include "common/chat_template/value.h"
#include "common/util/status_macros.h"

namespace pdserve {

struct ChatTemplate::Syntax {
  jinja::Body body;
};

ChatTemplate::ChatTemplate(std::string origin, std::string source,
                           std::unique_ptr<const Syntax> syntax)
    : origin_(std::move(origin)),
      source_(std::move(source)),
      syntax_(std::move(syntax)) {}

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(
    std::string_view source, std::string origin) {
  if (!jinja::IsValidUtf8(source)) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": chat template is not valid UTF-8"));
  }
  auto syntax = std::make_unique<Syntax>();
  ASSIGN_OR_RETURN(syntax->body, jinja::ParseTemplate(source, origin));
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(
      std::move(origin), std::string(source), std::move(syntax)));
}

absl::StatusOr<std::string> ChatTemplate::Render(
    const ChatTemplateInput& input) const {
  return Render(input, ChatTemplateLimits());
}

namespace {

// The text transformers looks for with continue_final_message: the content
// of the last message, or its last text block.
absl::StatusOr<std::string> FinalMessageText(
    const nlohmann::ordered_json& messages) {
  if (messages.empty() || !messages.back().is_object() ||
      !messages.back().contains("content")) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but there is no final message content");
  }
  const auto& content = messages.back()["content"];
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    for (auto it = content.rbegin(); it != content.rend(); ++it) {
      if (it->is_object() && it->contains("text") &&
          (*it)["text"].is_string()) {
        return (*it)["text"].get<std::string>();
      }
    }
  }
  return absl::InvalidArgumentError(
      "continue_final_message is set but we could not find any text to "
      "continue "
      "in the final message!");
}

}  // namespace

absl::StatusOr<std::string> ChatTemplate::Render(
    const ChatTemplateInput& input, const ChatTemplateLimits& limits) const {
  if (!input.messages.is_array()) {
    return absl::InvalidArgumentError(
        "messages must be a JSON list of messages");
  }
  if (input.continue_final_message && input.add_generation_prompt) {
    return absl::InvalidArgumentError(
        "continue_final_message and add_generation_prompt are not compatible. "
        "Use continue_final_message when you want the model to continue the "
        "final message, and add_generation_prompt when you want to add a "
        "header that will prompt it to start a new assistant message instead.");
  }
  if (!input.kwargs.is_null() && !input.kwargs.is_object()) {
    return absl::InvalidArgumentError(
        "chat template kwargs must be a JSON object");
  }
  std::vector<std::pair<std::string, jinja::Value>> vars;
  vars.emplace_back("bos_token", jinja::Value::String(input.bos_token));
  vars.emplace_back("eos_token", jinja::Value::String(input.eos_token));
  if (input.kwargs.is_object()) {
    for (const auto& [key, value] : input.kwargs.items()) {
      if (key == "messages" || key == "tools" || key == "documents" ||
          key == "add_generation_prompt") {
        return absl::InvalidArgumentError(
            absl::StrCat("chat template kwargs may not set '", key, "'"));
      }
      ASSIGN_OR_RETURN(jinja::Value v, jinja::FromJson(value));
      bool replaced = false;
      for (auto& [k, old] : vars) {
        if (k == key) {
          old = v;
          replaced = true;
        }
      }
      if (!replaced) vars.emplace_back(key, std::move(v));
    }
  }
  ASSIGN_OR_RETURN(jinja::Value messages, jinja::FromJson(input.messages));
  vars.emplace_back("messages", std::move(messages));
  if (input.tools.is_null()) {
    vars.emplace_back("tools", jinja::Value::None());
  } else {
    ASSIGN_OR_RETURN(jinja::Value tools, jinja::FromJson(input.tools));
    vars.emplace_back("tools", std::move(tools));
  }
  vars.emplace_back("documents", jinja::Value::None());
  vars.emplace_back("add_generation_prompt",
                    jinja::Value::Bool(input.add_generation_prompt));

  std::string out;
  {
    jinja::Renderer renderer(limits, input.now);
    RETURN_IF_ERROR(renderer.Render(syntax_->body, std::move(vars), &out));
  }
  if (!input.continue_final_message) return out;

  ASSIGN_OR_RETURN(std::string final_message, FinalMessageText(input.messages));
  const std::string stripped(
      jinja::PyStrip(final_message, nullptr, true, true));
  const size_t loc = out.rfind(stripped);
  if (loc == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but the final message does not appear "
        "in "
        "the chat after applying the chat template! This can happen if the "
        "chat "
        "template deletes portions of the final message. Please verify the "
        "chat "
        "template outputs the final message in your chat at least once.");
  }
  const std::string_view lstripped =
      jinja::PyStrip(final_message, nullptr, true, false);
  if (out.compare(loc, lstripped.size(), final_message) == 0) {
    out.resize(loc + lstripped.size());
  } else {
    out.resize(loc + stripped.size());
  }
  return out;
}

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token in tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::optional<std::string> TokenString(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<ModelChatTemplates> ModelChatTemplates::Load(
    const std::string& model_dir, const std::string& override_file) {
  namespace fs = std::filesystem;
  ModelChatTemplates result;
  nlohmann::ordered_json config;
  const std::string config_path =
      model_dir.empty()
          ? ""
          : (fs::path(model_dir) / "tokenizer_config.json").string();
  if (!config_path.empty() && fs::exists(config_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    config = nlohmann::ordered_json::parse(text, nullptr,
                                           /*allow_exceptions=*/false);
    if (!config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, " is not a JSON object"));
    }
    for (const auto& [key, value] : config.items()) {
      const bool special =
          key.size() > 6 && key.substr(key.size() - 6) == "_token";
      if (!special) continue;
      if (auto token = TokenString(value)) {
        result.special_tokens_[key] = *token;
        if (key == "bos_token") result.bos_token_ = *token;
        if (key == "eos_token") result.eos_token_ = *token;
      }
    }
  }
  auto add = [&result](std::string name, std::string_view source,
                       std::string origin) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<ChatTemplate> t,
                     ChatTemplate::Parse(source, std::move(origin)));
    result.templates_[std::move(name)] = std::move(t);
    return absl::OkStatus();
  };
  if (!override_file.empty()) {
    ASSIGN_OR_RETURN(std::string source, ReadFile(override_file));
    RETURN_IF_ERROR(add("default", source, override_file));
    return result;
  }
  const std::string jinja_path =
      model_dir.empty()
          ? ""
          : (fs::path(model_dir) / "chat_template.jinja").string();
  if (!jinja_path.empty() && fs::exists(jinja_path)) {
    ASSIGN_OR_RETURN(std::string source, ReadFile(jinja_path));
    RETURN_IF_ERROR(add("default", source, jinja_path));
    return result;
  }
  if (config.is_object() && config.contains("chat_template")) {
    const auto& ct = config["chat_template"];
    if (ct.is_string()) {
      RETURN_IF_ERROR(add("default", ct.get<std::string>(),
                          absl::StrCat(config_path, " chat_template")));
    } else if (ct.is_array()) {
      for (const auto& entry : ct) {
        if (!entry.is_object() || !entry.contains("name") ||
            !entry.contains("template") || !entry["name"].is_string() ||
            !entry["template"].is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              config_path,
              ": chat_template list entries must be {\"name\", \"template\"}"));
        }
        const std::string name = entry["name"].get<std::string>();
        RETURN_IF_ERROR(
            add(name, entry["template"].get<std::string>(),
                absl::StrCat(config_path, " chat_template '", name, "'")));
      }
    } else if (!ct.is_null()) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_path, ": chat_template must be a string or a list"));
    }
  }
  if (result.templates_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", model_dir.empty() ? "(none)" : model_dir,
        " has no chat template (no chat_template in tokenizer_config.json and "
        "no chat_template.jinja); pass --chat_template=FILE with a Jinja chat "
        "template"));
  }
  return result;
}

const ChatTemplate* ModelChatTemplates::Select(bool has_tools) const {
  if (has_tools) {
    auto it = templates_.find("tool_use");
    if (it != templates_.end()) return it->second.get();
  }
  auto it = templates_.find("default");
  return it == templates_.end() ? nullptr : it->second.get();
}

absl::StatusOr<const ChatTemplate*> ModelChatTemplates::SelectOrError(
    bool has_tools) const {
  if (const ChatTemplate* t = Select(has_tools)) return t;
  return absl::FailedPreconditionError(
      absl::StrCat("this model has several chat templates (",
                   absl::StrJoin(names(), ", "), ") and no \"default\" one",
                   has_tools ? "" : " for requests without tools",
                   "; pass --chat_template=FILE"));
}

void ModelChatTemplates::ApplySpecialTokens(ChatTemplateInput* input) const {
  input->bos_token = bos_token_;
  input->eos_token = eos_token_;
  if (!input->kwargs.is_object())
    input->kwargs = nlohmann::ordered_json::object();
  for (const auto& [key, value] : special_tokens_.items()) {
    if (key == "bos_token" || key == "eos_token" ||
        input->kwargs.contains(key)) {
      continue;
    }
    input->kwargs[key] = value;
  }
}

std::vector<std::string> ModelChatTemplates::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : templates_) out.push_back(name);
  return out;
}

}  // namespace pdserve
