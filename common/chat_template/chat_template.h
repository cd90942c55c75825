// Chat templates: the Jinja2 templates Hugging Face models ship to turn a
// conversation (messages, tools) into the prompt text, rendered exactly as
// transformers' apply_chat_template renders them (jinja2's
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and
// loopcontrols; transformers' tojson, raise_exception and strftime_now).
//
//   auto templates = ModelChatTemplates::Load(model_dir, flag_chat_template);
//   ChatTemplateInput in;
//   in.messages = request["messages"];  // parsed as nlohmann::ordered_json
//   in.tools = request["tools"];        // or null
//   in.kwargs = request["chat_template_kwargs"];  // or null
//   templates->ApplySpecialTokens(&in);  // bos_token, eos_token, unk_token...
//   ASSIGN_OR_RETURN(const ChatTemplate* t,
//                    templates->SelectOrError(!in.tools.is_null()));
//   absl::StatusOr<std::string> prompt = t->Render(in);
//
// The rendered text already contains every special token the template writes
// (BOS included): tokenize it WITHOUT adding special tokens.
//
// Errors: a template syntax error is INVALID_ARGUMENT "origin:line: message";
// a render error is INVALID_ARGUMENT carrying the message (the template's own
// raise_exception message verbatim; otherwise jinja2's wording, e.g.
// "'dict object' has no attribute 'x'"). Renders are bounded by
// ChatTemplateLimits (nesting, evaluation steps, string and list sizes).
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_

#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template/limits.h"
#include "nlohmann/json.hpp"

namespace pdserve {

// What one render sees. Template variables: messages, tools (None when
// null), documents (None), add_generation_prompt, bos_token, eos_token, then
// every key of `kwargs` (which may override the special tokens, as
// transformers merges {**special_tokens_map, **kwargs}).
struct ChatTemplateInput {
  nlohmann::ordered_json messages;  // a list of message objects
  bool add_generation_prompt = true;
  // transformers' continue_final_message: render, then cut the text right
  // after the final message's content so the model continues it. Requires
  // add_generation_prompt = false.
  bool continue_final_message = false;
  nlohmann::ordered_json tools;  // null = no tools
  std::string bos_token;
  std::string eos_token;
  nlohmann::ordered_json kwargs;   // object or null: extra template variables
  std::optional<std::time_t> now;  // pins strftime_now (default: the clock)
};

// One parsed template. Immutable after Parse: Render is const and may run
// concurrently from many threads.
class ChatTemplate {
 public:
  // `origin` names the template in syntax errors (a file name).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(
      std::string_view source, std::string origin);

  absl::StatusOr<std::string> Render(const ChatTemplateInput& input) const;
  absl::StatusOr<std::string> Render(const ChatTemplateInput& input,
                                     const ChatTemplateLimits& limits) const;

  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }

  ~ChatTemplate();

 private:
  struct Syntax;
  ChatTemplate(std::string origin, std::string source,
               std::unique_ptr<const Syntax> syntax);

  std::string origin_;
  std::string source_;
  std::unique_ptr<const Syntax> syntax_;
};

// The chat templates of a model and the special tokens they are rendered
// with. Immutable after Load; safe to share between threads.
//
// Sources, in order: `override_file` (--chat_template=FILE) if given; else
// `<model_dir>/chat_template.jinja` (newer transformers save it there); else
// `chat_template` of `<model_dir>/tokenizer_config.json`, a string or a list
// of {"name", "template"}. bos_token / eos_token (strings or AddedToken
// objects {"content": ...}) and the other *_token entries come from
// tokenizer_config.json when model_dir has one.
class ModelChatTemplates {
 public:
  // FAILED_PRECONDITION when the model has no chat template (the message
  // tells the user to pass --chat_template=FILE); INVALID_ARGUMENT for an
  // unreadable config or a template syntax error; NOT_FOUND for a missing
  // override file.
  static absl::StatusOr<ModelChatTemplates> Load(
      const std::string& model_dir, const std::string& override_file);

  // transformers' choice: "tool_use" when tools are given and it exists,
  // else "default"; nullptr when neither applies (a model with only named
  // templates and no "default").
  const ChatTemplate* Select(bool has_tools) const;
  // Select, or FAILED_PRECONDITION naming the available templates.
  absl::StatusOr<const ChatTemplate*> SelectOrError(bool has_tools) const;

  // Sets input->bos_token / eos_token and adds the other special tokens to
  // input->kwargs, keeping any key kwargs already has (transformers renders
  // with {**special_tokens_map, **kwargs}).
  void ApplySpecialTokens(ChatTemplateInput* input) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // bos_token, eos_token, unk_token, pad_token, ... (strings) as transformers'
  // special_tokens_map: the variables templates may reference besides bos/eos.
  const nlohmann::ordered_json& special_tokens() const {
    return special_tokens_;
  }
  std::vector<std::string> names() const;

 private:
  std::map<std::string, std::shared_ptr<const ChatTemplate>> templates_;
  std::string bos_token_;
  std::string eos_token_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
