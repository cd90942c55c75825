// Fuzz test (deterministic seeds): random bytes and mutated text through
// Encode, random ids through Decode and the streaming detokenizer, random
// truncations/mutations of tokenizer.json through Load. Nothing may crash;
// statuses must be OK or INVALID_ARGUMENT; valid text must round-trip on the
// byte-level tokenizers. Also built and run under AddressSanitizer by
// tests/unit/asan_test.sh (CTest label "asan").
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/unit/tokenizer_test_util.h"

namespace pdserve {
namespace {

using testing_util::FixtureDir;
using testing_util::IsValidUtf8;

// Pieces that exercise every path: ASCII, spaces, digits, punctuation, CJK,
// emoji (byte fallback), combining marks, special-token text, NBSP.
const std::vector<std::string>& Fragments() {
  static const std::vector<std::string> f = {"Hello",      " world",
                                             "  ",         "\n",
                                             "\t",         "123",
                                             "4567",       "3.14",
                                             "!?",         "'s",
                                             "'ll",        "吃饭",
                                             "こんにちは", "😀",
                                             "👍🏽",   "e\u0301",
                                             "\u00a0",     "<s>",
                                             "</s>",       "<|endoftext|>",
                                             ">>TITLE<<",  "\u2581",
                                             "Ġ",          "<0x41>",
                                             "_",          "https://x.y/z?q=1",
                                             "مرحبا",      "𝔘"};
  return f;
}

std::string RandomText(std::mt19937& rng, bool valid) {
  std::string s;
  const int parts = rng() % 12;
  for (int i = 0; i < parts; ++i) {
    if (!valid && rng() % 4 == 0) {
      s.push_back(static_cast<char>(rng() % 256));
    } else {
      s += Fragments()[rng() % Fragments().size()];
    }
  }
  return s;
}

class FuzzTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzTest, EncodeDecodeStream) {
  auto loaded = Tokenizer::Load(FixtureDir(GetParam()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tokenizer& tok = **loaded;
  // Byte-level tokenizers decode any byte string back exactly; GPT-2 also
  // has a token for every byte (Falcon lacks some control bytes and, with
  // no unk_token, drops them like HF does), so only it round-trips all text.
  const bool byte_level = GetParam() != "llama2";
  const bool all_bytes = GetParam() == "gpt2";
  std::mt19937 rng(42);
  for (int iter = 0; iter < 1500; ++iter) {
    const std::string text = RandomText(rng, iter % 2 == 0);
    auto ids = tok.Encode(text, iter % 3 == 0);
    if (!IsValidUtf8(text)) {
      ASSERT_FALSE(ids.ok());
      EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ASSERT_TRUE(ids.ok()) << ids.status();
    auto text2 = tok.Decode(*ids, /*skip_special_tokens=*/false);
    ASSERT_TRUE(text2.ok());
    EXPECT_TRUE(IsValidUtf8(*text2));
    if (all_bytes) {
      EXPECT_EQ(*text2, text);
    }
  }
  // Random ids (any token, including bytes that never form characters).
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<int32_t> ids(rng() % 24);
    for (auto& id : ids) {
      id = rng() % 8 == 0 ? static_cast<int32_t>(rng() % 300)  // bytes/special
                          : static_cast<int32_t>(rng() % tok.vocab_size());
    }
    const bool skip = rng() % 2;
    auto text = tok.Decode(ids, skip);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_TRUE(IsValidUtf8(*text));
    IncrementalDetokenizer detok(tok, skip);
    std::string streamed;
    for (int32_t id : ids) {
      auto delta = detok.Add(id);
      ASSERT_TRUE(delta.ok());
      EXPECT_TRUE(IsValidUtf8(*delta));
      streamed += *delta;
    }
    streamed += detok.Flush();
    EXPECT_TRUE(IsValidUtf8(streamed));
    // Byte-level decoding is local, so streaming is exact even on garbage.
    if (byte_level) {
      EXPECT_EQ(streamed, *text);
    }
    // Out-of-range ids are rejected, never read.
    ids.push_back(rng() % 2
                      ? -1 - static_cast<int32_t>(rng() % 100)
                      : tok.vocab_size() + static_cast<int32_t>(rng() % 100));
    EXPECT_EQ(tok.Decode(ids, skip).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FuzzTest,
                         ::testing::Values("llama2", "gpt2", "falcon"));

TEST(FuzzLoad, MutatedTokenizerJson) {
  std::ifstream in("models/stories260K/tokenizer.json");
  const std::string original((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  ASSERT_GT(original.size(), 100u);
  const std::string path = ::testing::TempDir() + "/fuzz_tokenizer.json";
  std::mt19937 rng(7);
  int loaded = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string text = original;
    switch (iter % 3) {
      case 0:  // truncate
        text.resize(rng() % text.size());
        break;
      case 1:  // flip bytes
        for (int k = 0; k < 1 + static_cast<int>(rng() % 8); ++k) {
          text[rng() % text.size()] = static_cast<char>(rng() % 256);
        }
        break;
      default: {  // delete a range
        const size_t at = rng() % text.size();
        text.erase(at, rng() % 64);
        break;
      }
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    auto tok = Tokenizer::Load(path);
    if (!tok.ok()) {
      EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument)
          << tok.status();
      continue;
    }
    ++loaded;
    auto ids = (*tok)->Encode("Once upon a time 😀 <s>", true);
    if (ids.ok()) {
      EXPECT_TRUE((*tok)->Decode(*ids, false).ok());
    }
  }
  EXPECT_LT(loaded, 300);
}

}  // namespace
}  // namespace pdserve
