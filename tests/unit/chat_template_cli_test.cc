// `pdserve render-chat` (runs the built binary): reproduces every line of
// tests/data/chat_templates/reference.jsonl, tokenizes without adding special
// tokens (one BOS, written by the template), uses the model's own template
// and special tokens, and exits 0 for template errors but 1 for unreadable
// input or a model without a template.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/chat_template_test_util.h"

namespace pdserve {
namespace {

using nlohmann::ordered_json;
using testing_util::kChatTemplateData;
using testing_util::ReadOrderedJsonl;

struct CliResult {
  int exit_code = -1;
  std::string out;
};

// Runs `pdserve ARGS` and returns its exit code and stdout.
CliResult RunPdserve(const std::string& args) {
  const std::string cmd =
      std::string(PDSERVE_BINARY) + " " + args + " 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  CliResult r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<ordered_json> Lines(const std::string& out) {
  std::vector<ordered_json> lines;
  size_t start = 0;
  while (start < out.size()) {
    const size_t end = out.find('\n', start);
    lines.push_back(ordered_json::parse(out.substr(start, end - start)));
    start = end == std::string::npos ? out.size() : end + 1;
  }
  return lines;
}

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/render_chat_test_XXXXXX";
    const int fd = mkstemp(tmpl);
    close(fd);
    path_ = tmpl;
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(RenderChatCli, ReproducesTheReferences) {
  const auto reference =
      ReadOrderedJsonl(std::string(kChatTemplateData) + "/reference.jsonl");
  std::map<std::string, std::vector<ordered_json>> by_template;
  for (const auto& line : reference) {
    by_template[line["template"].get<std::string>()].push_back(line);
  }
  int matched = 0;
  for (const auto& [name, lines] : by_template) {
    std::string input;
    for (const auto& line : lines) input += line.dump() + "\n";
    TempFile file(input);
    const CliResult run = RunPdserve(
        std::string("render-chat --chat_template=") + kChatTemplateData +
        "/templates/" + name + ".jinja --input_jsonl=" + file.path());
    ASSERT_EQ(run.exit_code, 0) << name;
    const auto out = Lines(run.out);
    ASSERT_EQ(out.size(), lines.size()) << name;
    for (size_t i = 0; i < lines.size(); ++i) {
      SCOPED_TRACE(name + " / " + lines[i]["case"].get<std::string>());
      if (lines[i].contains("error")) {
        EXPECT_EQ(out[i], ordered_json({{"error", lines[i]["error"]}}));
      } else {
        EXPECT_EQ(out[i], ordered_json({{"rendered", lines[i]["rendered"]}}));
      }
      if (!HasFailure()) ++matched;
    }
  }
  EXPECT_EQ(matched, 37);
}

TEST(RenderChatCli, TokenizesWithoutAddingSpecialTokens) {
  const std::string dir = "tests/data/tokenizers/llama2";
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  // The model's own template and special tokens (no bos/eos in the input).
  TempFile file(
      R"({"messages": [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Bye"}]})"
      "\n");
  for (const std::string& flags :
       {"--model=" + dir, "--chat_template=" + std::string(kChatTemplateData) +
                              "/templates/llama2.jinja --tokenizer=" + dir}) {
    SCOPED_TRACE(flags);
    const CliResult run =
        RunPdserve("render-chat " + flags + " --input_jsonl=" + file.path());
    ASSERT_EQ(run.exit_code, 0);
    const auto out = Lines(run.out);
    ASSERT_EQ(out.size(), 1u);
    const std::string text = out[0]["rendered"].get<std::string>();
    EXPECT_EQ(text, "<s>[INST] Hello! [/INST] Hi. </s><s>[INST] Bye [/INST]");
    const auto ids = out[0]["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, (*tok)->Encode(text, /*add_special_tokens=*/false).value());
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids[0], (*tok)->bos_id().value());
    EXPECT_NE(ids[1], (*tok)->bos_id().value());  // no double BOS
  }
}

TEST(RenderChatCli, ExitStatusAndOneConversation) {
  const std::string qwen = std::string("--chat_template=") + kChatTemplateData +
                           "/templates/Qwen-Qwen2.5-7B-Instruct.jinja";
  // A bad line is reported in place; the others still render; exit 1.
  TempFile mixed(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\nnot json\n"
      "[{\"role\": \"user\", \"content\": \"b\"}]\n");
  CliResult run =
      RunPdserve("render-chat " + qwen + " --input_jsonl=" + mixed.path());
  EXPECT_EQ(run.exit_code, 1);
  auto out = Lines(run.out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].contains("rendered"));
  EXPECT_TRUE(out[1].contains("error"));
  EXPECT_TRUE(out[2].contains("rendered"));
  EXPECT_EQ(RunPdserve("render-chat " + qwen + " --input_jsonl=/nonexistent")
                .exit_code,
            1);
  // A model without a template.
  run = RunPdserve("render-chat --model=models/stories260K --input_jsonl=" +
                   mixed.path());
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_TRUE(run.out.empty());
  // One conversation as an argument; --json.
  run = RunPdserve("render-chat " + qwen +
                   " '[{\"role\": \"user\", \"content\": \"Hi\"}]'");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_EQ(run.out,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You "
            "are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>"
            "\n<|im_start|>assistant\n");
  run = RunPdserve(
      "render-chat --json " + qwen +
      " '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
      "\"add_generation_prompt\": false}'");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_EQ(Lines(run.out).at(0)["rendered"],
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You "
            "are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>"
            "\n");
}

}  // namespace
}  // namespace pdserve
