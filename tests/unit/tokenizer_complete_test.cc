// `pdserve complete` with a text prompt: the prompt is tokenized with the
// model directory's tokenizer (BOS from its post-processor) and the greedy
// output matches the stories260K references (ids and `text`); a text prompt
// gives exactly the run of its tokenized ids passed as --prompt_ids.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/tokenizer_test_util.h"

namespace pdserve {
namespace {

// Runs the pdserve binary with `args` and returns its stdout.
std::string RunPdserve(const std::string& args) {
  const std::string cmd = std::string(PDSERVE_BINARY) + " " + args;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  EXPECT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe.get())) > 0) out.append(buf, n);
  return out;
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

TEST(CompleteTextPrompt, MatchesGreedyReferences) {
  for (const auto& row :
       testing_util::ReadJsonl("models/stories260K/reference_greedy.jsonl")) {
    const std::string prompt = row["prompt"];
    SCOPED_TRACE(prompt);
    const std::string out = RunPdserve(
        "complete --model=models/stories260K --temperature=0 --json "
        "--max_tokens=" +
        std::to_string(row["max_new_tokens"].get<int>()) + " " + Quote(prompt));
    const auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << out;
    EXPECT_EQ(j["prompt_ids"], row["prompt_ids"]);
    EXPECT_EQ(j["output_ids"], row["output_ids"]);
    EXPECT_EQ(j["text"], row["output_text"]);
  }
}

TEST(CompleteTextPrompt, SameAsTokenizedIds) {
  auto tok = Tokenizer::Load("models/stories260K");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string prompt = "Once upon a time";
  const auto ids = (*tok)->Encode(prompt, /*add_special_tokens=*/true).value();
  ASSERT_EQ(ids.front(), (*tok)->bos_id().value());
  const std::string flags =
      "complete --model=models/stories260K --temperature=0 --max_tokens=40 "
      "--json ";
  const auto by_text =
      nlohmann::json::parse(RunPdserve(flags + Quote(prompt)), nullptr, false);
  const auto by_ids = nlohmann::json::parse(
      RunPdserve(flags + "--prompt_ids=" + absl::StrJoin(ids, ",")), nullptr,
      false);
  ASSERT_TRUE(by_text.is_object());
  ASSERT_TRUE(by_ids.is_object());
  EXPECT_EQ(by_text["prompt_ids"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(by_text["output_ids"], by_ids["output_ids"]);
  EXPECT_EQ(by_text["output_ids"].size(), 40u);
  // `text` is the continuation of the prompt's text.
  std::vector<int32_t> all = ids;
  for (int32_t id : by_text["output_ids"].get<std::vector<int32_t>>()) {
    all.push_back(id);
  }
  const std::string full = (*tok)->Decode(all, true).value();
  EXPECT_EQ(prompt + by_text["text"].get<std::string>(), full);
}

}  // namespace
}  // namespace pdserve
