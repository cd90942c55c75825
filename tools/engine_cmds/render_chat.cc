// `pdserve render-chat`: renders conversations through a chat template
// offline, as transformers' apply_chat_template would: the model's template
// (tokenizer_config.json / chat_template.jinja of --model) or
// --chat_template=FILE. One JSON line out per input line ({"rendered"} or
// {"error"}, plus "ids" with a tokenizer), so the output can be diffed
// against tests/data/chat_templates/reference.jsonl.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/chat_template/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/common_flags.h"
#include "tools/subcommand.h"

namespace pdserve {
namespace {

using nlohmann::ordered_json;

// Whether a flag was set to something other than its default (this Abseil
// does not expose IsSpecifiedOnCommandLine).
bool FlagGiven(const char* name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && flag->CurrentValue() != flag->DefaultValue();
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "pdserve render-chat: %s\n", status.ToString().c_str());
  return 1;
}

// The directory whose tokenizer_config.json supplies the special tokens:
// --tokenizer (a directory, or the one holding tokenizer.json), else --model
// when given on the command line.
std::string SpecialTokensDir() {
  const std::string tok = absl::GetFlag(FLAGS_tokenizer);
  if (!tok.empty()) {
    return std::filesystem::is_directory(tok)
               ? tok
               : std::filesystem::path(tok).parent_path().string();
  }
  return FlagGiven("model") ? absl::GetFlag(FLAGS_model) : "";
}

absl::StatusOr<ModelChatTemplates> LoadTemplates() {
  const std::string file = absl::GetFlag(FLAGS_chat_template);
  if (!file.empty()) return ModelChatTemplates::Load(SpecialTokensDir(), file);
  // The model's own template: --model, else the --tokenizer directory.
  std::string dir = absl::GetFlag(FLAGS_model);
  if (!FlagGiven("model") && !absl::GetFlag(FLAGS_tokenizer).empty()) {
    dir = SpecialTokensDir();
  }
  return ModelChatTemplates::Load(dir, "");
}

// The tokenizer for "ids": --tokenizer, else --model when given.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer() {
  std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty() && FlagGiven("model")) path = absl::GetFlag(FLAGS_model);
  if (path.empty()) return std::unique_ptr<Tokenizer>();
  return Tokenizer::Load(path);
}

// One conversation: {"messages", "add_generation_prompt", "tools",
// "bos_token", "eos_token", "kwargs", "continue_final_message", "now"}; a
// bare list is the messages. Missing fields take defaults.
absl::StatusOr<ChatTemplateInput> InputFromJson(const ordered_json& j,
                                                const ModelChatTemplates& m) {
  ChatTemplateInput in;
  ordered_json line = j.is_array() ? ordered_json{{"messages", j}} : j;
  if (!line.is_object()) {
    return absl::InvalidArgumentError(
        "expected a JSON object {\"messages\": [...], ...} or a list of "
        "messages");
  }
  if (line.contains("kwargs") && !line["kwargs"].is_null()) {
    if (!line["kwargs"].is_object()) {
      return absl::InvalidArgumentError("kwargs must be a JSON object");
    }
    in.kwargs = line["kwargs"];
  }
  m.ApplySpecialTokens(&in);  // the line's kwargs win over special tokens
  try {
    in.messages = line.value("messages", ordered_json::array());
    in.add_generation_prompt = line.value("add_generation_prompt", true);
    in.continue_final_message = line.value("continue_final_message", false);
    if (line.contains("tools")) in.tools = line["tools"];
    in.bos_token = line.value("bos_token", in.bos_token);
    in.eos_token = line.value("eos_token", in.eos_token);
    if (line.contains("now")) in.now = line["now"].get<std::time_t>();
  } catch (const ordered_json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad field: ", e.what()));
  }
  return in;
}

// Renders one conversation: {"rendered", "ids"?} or {"error"}.
ordered_json RenderOne(const ChatTemplateInput& in, const ModelChatTemplates& m,
                       const Tokenizer* tok) {
  auto t = m.SelectOrError(!in.tools.is_null());
  if (!t.ok()) return {{"error", std::string(t.status().message())}};
  auto text = (*t)->Render(in);
  if (!text.ok()) return {{"error", std::string(text.status().message())}};
  ordered_json out = {{"rendered", *text}};
  if (tok != nullptr) {
    // The template wrote BOS itself: no special tokens are added here.
    auto ids = tok->Encode(*text, /*add_special_tokens=*/false);
    if (!ids.ok()) return {{"error", std::string(ids.status().message())}};
    out["ids"] = *ids;
  }
  return out;
}

std::string Dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

int RunJsonl(const std::string& path, const ModelChatTemplates& m,
             const Tokenizer* tok) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    file.open(path);
    if (!file)
      return Fail(absl::NotFoundError(absl::StrCat("cannot open ", path)));
    in = &file;
  }
  std::string line;
  int line_no = 0;
  bool unreadable = false;
  while (std::getline(*in, line)) {
    ++line_no;
    if (line.empty()) continue;
    const ordered_json j = ordered_json::parse(line, nullptr, false);
    auto input = j.is_discarded() ? absl::InvalidArgumentError("not valid JSON")
                                  : InputFromJson(j, m);
    if (!input.ok()) {
      unreadable = true;
      std::fprintf(stderr, "%s:%d: %s\n", path.c_str(), line_no,
                   std::string(input.status().message()).c_str());
      std::printf(
          "%s\n",
          Dump({{"error", std::string(input.status().message())}}).c_str());
      continue;
    }
    std::printf("%s\n", Dump(RenderOne(*input, m, tok)).c_str());
  }
  return unreadable ? 1 : 0;
}

int RunRenderChat(const std::vector<std::string>& args) {
  const std::string jsonl = absl::GetFlag(FLAGS_input_jsonl);
  if (jsonl.empty() && args.size() != 2) {
    std::fprintf(stderr,
                 "pdserve render-chat: give --input_jsonl=FILE or one "
                 "conversation as a JSON argument (see --help)\n");
    return 2;
  }
  auto templates = LoadTemplates();
  if (!templates.ok()) return Fail(templates.status());
  auto tok = LoadTokenizer();
  if (!tok.ok()) return Fail(tok.status());
  if (!jsonl.empty()) return RunJsonl(jsonl, *templates, tok->get());

  const ordered_json j = ordered_json::parse(args[1], nullptr, false);
  if (j.is_discarded()) {
    return Fail(
        absl::InvalidArgumentError("the conversation is not valid JSON"));
  }
  auto input = InputFromJson(j, *templates);
  if (!input.ok()) return Fail(input.status());
  const ordered_json out = RenderOne(*input, *templates, tok->get());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Dump(out).c_str());
  } else if (out.contains("error")) {
    std::fprintf(stderr, "pdserve render-chat: %s\n",
                 out["error"].get<std::string>().c_str());
  } else {
    std::printf("%s", out["rendered"].get<std::string>().c_str());
    if (out.contains("ids")) {
      std::printf(
          "\n%s\n",
          absl::StrJoin(out["ids"].get<std::vector<int32_t>>(), ",").c_str());
    }
  }
  return 0;
}

PDSERVE_SUBCOMMAND(
    "render-chat", "render conversations through a chat template (offline)",
    "pdserve render-chat --chat_template=FILE --input_jsonl=FILE "
    "[--tokenizer=DIR]\n"
    "pdserve render-chat --model=DIR --input_jsonl=FILE   (the model's "
    "template)\n"
    "pdserve render-chat [--chat_template=FILE | --model=DIR] [--json] "
    "'[{\"role\": \"user\", \"content\": \"Hi\"}]'\n"
    "\n"
    "Renders exactly as Hugging Face transformers' apply_chat_template.\n"
    "Input lines (--input_jsonl; '-' reads stdin) hold the fields of\n"
    "tests/data/chat_templates/reference.jsonl: {\"messages\": [...],\n"
    "\"add_generation_prompt\": true, \"tools\": null, \"bos_token\": "
    "\"<s>\",\n"
    "\"eos_token\": \"</s>\", \"kwargs\": {...}}, optionally\n"
    "\"continue_final_message\" and \"now\" (Unix seconds, pins "
    "strftime_now).\n"
    "Missing fields take defaults: a generation prompt, no tools, bos/eos\n"
    "from the tokenizer_config.json of --tokenizer or --model when given\n"
    "(else \"\"). Each line gives {\"rendered\": TEXT} or {\"error\": "
    "MESSAGE};\n"
    "with --tokenizer (or --model) also \"ids\": the text tokenized WITHOUT\n"
    "special tokens (the template writes BOS itself).\n"
    "Exit status: 0 when every line rendered or failed with a template\n"
    "error; 1 for unreadable input or an unusable template; 2 for bad usage.",
    FlagNames({{"model", "tokenizer", "chat_template", "input_jsonl", "json"}}),
    RunRenderChat);

}  // namespace
}  // namespace pdserve
