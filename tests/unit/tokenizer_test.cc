// Reference tests: every row of the HF `tokenizers` reference files (ids
// with/without special tokens, token strings, decoded text) and the
// stories260K greedy references, plus the streaming detokenizer on all of
// them, and bad-input statuses.
#include "common/tokenizer/tokenizer.h"

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/tokenizer_test_util.h"

namespace pdserve {
namespace {

using testing_util::FixtureDir;
using testing_util::IsValidUtf8;
using testing_util::ReadJsonl;

const Tokenizer& Get(const std::string& path) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[path];
  if (slot == nullptr) {
    auto loaded = Tokenizer::Load(path);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    slot = std::move(loaded).value();
  }
  return *slot;
}

// Streams `ids` through an IncrementalDetokenizer; checks every delta is
// valid UTF-8 and equals what Peek read before it (after peeking other ids,
// which must change nothing), and returns the concatenation.
std::string Stream(const Tokenizer& tok, const std::vector<int32_t>& ids,
                   bool skip_special, const std::vector<int32_t>& prompt = {}) {
  IncrementalDetokenizer detok(tok, skip_special, prompt);
  std::string all;
  for (int32_t id : ids) {
    for (int32_t other : {0, id / 2, tok.vocab_size() - 1}) {
      EXPECT_TRUE(detok.Peek(other).ok());
    }
    auto peeked = detok.Peek(id);
    auto delta = detok.Add(id);
    EXPECT_TRUE(delta.ok()) << delta.status();
    EXPECT_TRUE(peeked.ok()) << peeked.status();
    if (delta.ok() && peeked.ok()) EXPECT_EQ(*peeked, *delta) << "id " << id;
    EXPECT_TRUE(IsValidUtf8(*delta)) << "id " << id;
    all += *delta;
  }
  const std::string tail = detok.Flush();
  EXPECT_TRUE(IsValidUtf8(tail));
  return all + tail;
}

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, EveryRowMatches) {
  const Tokenizer& tok = Get(FixtureDir(GetParam()));
  const auto rows = ReadJsonl(FixtureDir(GetParam()) + "/reference.jsonl");
  ASSERT_GE(rows.size(), 30u);
  for (const auto& row : rows) {
    const std::string text = row["text"];
    SCOPED_TRACE(text);
    const auto no_special = row["ids_no_special"].get<std::vector<int32_t>>();
    const auto with_special =
        row["ids_with_special"].get<std::vector<int32_t>>();
    auto ids = tok.Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, no_special);
    auto ids2 = tok.Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids2.ok()) << ids2.status();
    EXPECT_EQ(*ids2, with_special);
    std::vector<std::string> tokens;
    for (int32_t id : no_special) tokens.push_back(tok.IdToToken(id).value());
    EXPECT_EQ(tokens, row["tokens"].get<std::vector<std::string>>());
    auto decoded = tok.Decode(no_special, /*skip_special_tokens=*/true);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, row["decoded"].get<std::string>());
    auto kept = tok.Decode(with_special, /*skip_special_tokens=*/false);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(*kept, row["decoded_keep_special"].get<std::string>());
  }
}

TEST_P(ReferenceTest, StreamingConcatenatesToDecode) {
  const Tokenizer& tok = Get(FixtureDir(GetParam()));
  for (const auto& row :
       ReadJsonl(FixtureDir(GetParam()) + "/reference.jsonl")) {
    SCOPED_TRACE(row["text"].get<std::string>());
    for (const char* field : {"ids_no_special", "ids_with_special"}) {
      const auto ids = row[field].get<std::vector<int32_t>>();
      for (bool skip : {true, false}) {
        EXPECT_EQ(Stream(tok, ids, skip), tok.Decode(ids, skip).value())
            << field << " skip=" << skip;
      }
    }
  }
}

// Random mixtures of the reference strings: encode, then stream the ids
// and also stream them as the continuation of a prompt.
TEST_P(ReferenceTest, StreamingOnMixedText) {
  const Tokenizer& tok = Get(FixtureDir(GetParam()));
  const auto rows = ReadJsonl(FixtureDir(GetParam()) + "/reference.jsonl");
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 200; ++iter) {
    std::string text;
    const int parts = 1 + rng() % 4;
    for (int k = 0; k < parts; ++k) {
      text += rows[rng() % rows.size()]["text"].get<std::string>();
      if (rng() % 2) text += " ";
    }
    SCOPED_TRACE(text);
    auto ids = tok.Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(Stream(tok, *ids, true), tok.Decode(*ids, true).value());
    // Split into prompt + output at a random point where the prompt's text
    // is a prefix of the whole text (not inside a character).
    const std::string full = tok.Decode(*ids, true).value();
    size_t cut = ids->empty() ? 0 : rng() % ids->size();
    std::string head;
    while (true) {
      head =
          tok.Decode(absl::MakeConstSpan(*ids).subspan(0, cut), true).value();
      if (full.compare(0, head.size(), head) == 0 || cut == 0) break;
      --cut;
    }
    const std::vector<int32_t> prompt(ids->begin(), ids->begin() + cut);
    const std::vector<int32_t> output(ids->begin() + cut, ids->end());
    EXPECT_EQ(Stream(tok, output, true, prompt), full.substr(head.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReferenceTest,
                         ::testing::Values("llama2", "gpt2", "falcon"));

TEST(Stories260K, PromptsAndGreedyOutputs) {
  const Tokenizer& tok = Get("models/stories260K");
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.IsSpecial(1));
  EXPECT_FALSE(tok.IsSpecial(300));
  const auto rows = ReadJsonl("models/stories260K/reference_greedy.jsonl");
  ASSERT_FALSE(rows.empty());
  for (const auto& row : rows) {
    const std::string prompt = row["prompt"];
    SCOPED_TRACE(prompt);
    const auto prompt_ids = row["prompt_ids"].get<std::vector<int32_t>>();
    const auto output_ids = row["output_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.Encode(prompt, true).value(), prompt_ids);
    std::vector<int32_t> all = prompt_ids;
    all.insert(all.end(), output_ids.begin(), output_ids.end());
    EXPECT_EQ(tok.Decode(all, true).value(),
              row["full_text"].get<std::string>());
    // The router streams the output as a continuation of the prompt.
    EXPECT_EQ(Stream(tok, output_ids, true, prompt_ids),
              row["output_text"].get<std::string>());
    EXPECT_EQ(Stream(tok, output_ids, true),
              tok.Decode(output_ids, true).value());
  }
}

TEST(Streaming, ByteFallbackCharactersAreNeverSplit) {
  const Tokenizer& tok = Get(FixtureDir("llama2"));
  const std::string text =
      "今天吃饭了吗？我不需要吃饭 😀👍🏽";
  const auto ids = tok.Encode(text, false).value();
  IncrementalDetokenizer detok(tok, true);
  std::string all;
  int held = 0;
  for (int32_t id : ids) {
    const std::string delta = detok.Add(id).value();
    EXPECT_TRUE(IsValidUtf8(delta));
    EXPECT_EQ(delta.find("\xEF\xBF\xBD"), std::string::npos);
    if (delta.empty()) ++held;
    all += delta;
  }
  all += detok.Flush();
  EXPECT_GT(held, 0);  // some ids were partial characters
  EXPECT_EQ(all, text);
}

TEST(Streaming, IncompleteTailIsFlushedAsReplacement) {
  const Tokenizer& tok = Get(FixtureDir("gpt2"));
  auto ids = tok.Encode("ab😀", false).value();
  ids.pop_back();  // drop the last byte of the emoji (its own token or not)
  const std::string expected = tok.Decode(ids, true).value();
  EXPECT_EQ(Stream(tok, ids, true), expected);
}

TEST(BadInput, InvalidUtf8IsRejected) {
  for (const auto& name : testing_util::FixtureNames()) {
    const Tokenizer& tok = Get(FixtureDir(name));
    for (const std::string& bad :
         {std::string("abc\xff"), std::string("\xc3"),
          std::string("a\xed\xa0\x80"), std::string("\xe4\xbd")}) {
      auto ids = tok.Encode(bad, true);
      ASSERT_FALSE(ids.ok());
      EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(ids.status().message().find("invalid UTF-8 at byte"),
                std::string::npos)
          << ids.status();
    }
  }
}

TEST(BadInput, OutOfRangeIdsAreRejected) {
  const Tokenizer& tok = Get(FixtureDir("gpt2"));
  for (int32_t id : {-1, tok.vocab_size(), 1 << 30}) {
    auto text = tok.Decode(std::vector<int32_t>{15496, id}, false);
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(text.status().message().find(std::to_string(id)),
              std::string::npos);
    IncrementalDetokenizer detok(tok, false);
    EXPECT_EQ(detok.Peek(id).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(detok.Add(id).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(detok.Add(15496).value(), "Hello");
  }
}

TEST(BadInput, MissingFile) {
  auto tok = Tokenizer::Load("tests/data/tokenizers/does-not-exist");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdserve
