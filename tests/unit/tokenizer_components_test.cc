// Component tests with the examples of the Hugging Face `tokenizers` docs:
// split behaviours, pre-tokenizers, normalizers, decoders, added-token
// options, load errors.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve::tok {
namespace {

using nlohmann::json;

std::vector<std::string> PreTokenize(const json& j, const std::string& text) {
  auto pre = MakePreTokenizer(j);
  EXPECT_TRUE(pre.ok()) << pre.status();
  std::vector<PreToken> pieces = {{text, true}};
  (*pre)->PreTokenize(&pieces);
  std::vector<std::string> out;
  for (auto& p : pieces) out.push_back(p.text);
  return out;
}

TEST(PreTokenizer, SplitBehaviours) {
  using V = std::vector<std::string>;
  const std::string text = "the-final--countdown";
  auto split = [&](const char* behavior) {
    return PreTokenize({{"type", "Split"},
                        {"pattern", {{"String", "-"}}},
                        {"behavior", behavior},
                        {"invert", false}},
                       text);
  };
  EXPECT_EQ(split("Removed"), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated"), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"),
            (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous"), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(PreTokenize({{"type", "Split"},
                         {"pattern", {{"Regex", "\\s+"}}},
                         {"behavior", "Removed"},
                         {"invert", true}},
                        "ab  cd"),
            (V{"  "}));
}

TEST(PreTokenizer, DigitsPunctuationWhitespaceMetaspace) {
  using V = std::vector<std::string>;
  EXPECT_EQ(PreTokenize({{"type", "Digits"}, {"individual_digits", true}},
                        "Call 123 please"),
            (V{"Call ", "1", "2", "3", " please"}));
  EXPECT_EQ(PreTokenize({{"type", "Digits"}, {"individual_digits", false}},
                        "Call 123 please"),
            (V{"Call ", "123", " please"}));
  EXPECT_EQ(PreTokenize({{"type", "Punctuation"}, {"behavior", "Isolated"}},
                        "Hey friend!     How are you?!?"),
            (V{"Hey friend", "!", "     How are you", "?", "!", "?"}));
  EXPECT_EQ(PreTokenize({{"type", "Whitespace"}}, "Hey man!  x"),
            (V{"Hey", "man", "!", "x"}));
  EXPECT_EQ(PreTokenize({{"type", "WhitespaceSplit"}}, "Hey man!  x"),
            (V{"Hey", "man!", "x"}));
  EXPECT_EQ(PreTokenize({{"type", "Metaspace"},
                         {"replacement", "\u2581"},
                         {"prepend_scheme", "always"},
                         {"split", true}},
                        "Hey friend!"),
            (V{"\u2581Hey", "\u2581friend!"}));
  EXPECT_EQ(PreTokenize({{"type", "Metaspace"},
                         {"replacement", "\u2581"},
                         {"prepend_scheme", "never"},
                         {"split", false}},
                        "Hey friend!"),
            (V{"Hey\u2581friend!"}));
  EXPECT_EQ(PreTokenize({{"type", "ByteLevel"}, {"add_prefix_space", false}},
                        "Hello my friend, how is your day going?"),
            (V{"Hello", "\u0120my", "\u0120friend", ",", "\u0120how",
               "\u0120is", "\u0120your", "\u0120day", "\u0120going", "?"}));
  // GPT-2's \s+(?!\S): the last space of a run goes with the next word.
  EXPECT_EQ(PreTokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}},
                        "a   b\n"),
            (V{"\u0120a", "\u0120\u0120", "\u0120b", "\u010a"}));
}

std::string Normalize(const json& j, std::string text) {
  auto n = MakeNormalizer(j);
  EXPECT_TRUE(n.ok()) << n.status();
  (*n)->Normalize(&text);
  return text;
}

TEST(Normalizer, Forms) {
  EXPECT_EQ(
      Normalize({{"type", "NFKC"}}, "\uff48\uff45\uff4c\uff4c\uff4f\u2460"),
      "hello1");
  EXPECT_EQ(Normalize({{"type", "NFC"}}, "cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(Normalize({{"type", "NFD"}}, "caf\u00e9"), "cafe\u0301");
  EXPECT_EQ(Normalize({{"type", "Lowercase"}}, "H\u00c9LLO \u0130"),
            "h\u00e9llo i\u0307");
  EXPECT_EQ(
      Normalize(
          {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
          " \u3000 hi there \n"),
      "hi there");
  EXPECT_EQ(Normalize({{"type", "Replace"},
                       {"pattern", {{"Regex", " {2,}"}}},
                       {"content", " "}},
                      "a   b  c d"),
            "a b c d");
  EXPECT_EQ(Normalize({{"type", "Sequence"},
                       {"normalizers",
                        {{{"type", "Prepend"}, {"prepend", "\u2581"}},
                         {{"type", "Replace"},
                          {"pattern", {{"String", " "}}},
                          {"content", "\u2581"}}}}},
                      "a b"),
            "\u2581a\u2581b");
  EXPECT_EQ(Normalize({{"type", "Prepend"}, {"prepend", "x"}}, ""), "");
}

std::string Decode(const json& j, std::vector<std::string> tokens) {
  auto d = MakeDecoder(j);
  EXPECT_TRUE(d.ok()) << d.status();
  (*d)->DecodeChain(&tokens);
  std::string out;
  for (auto& t : tokens) out += t;
  return out;
}

TEST(Decoder, Components) {
  EXPECT_EQ(Decode({{"type", "Metaspace"},
                    {"replacement", "\u2581"},
                    {"prepend_scheme", "always"}},
                   {"\u2581Hey", "\u2581friend"}),
            "Hey friend");
  EXPECT_EQ(Decode({{"type", "ByteFallback"}},
                   {"a", "<0xE4>", "<0xBD>", "<0xA0>", "<0xFF>", "b"}),
            "a\uFFFD\uFFFD\uFFFD\uFFFDb");
  EXPECT_EQ(Decode({{"type", "ByteFallback"}}, {"<0xE4>", "<0xBD>", "<0xA0>"}),
            "\u4f60");
  EXPECT_EQ(
      Decode({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}},
             {"  a  "}),
      " a ");
  EXPECT_EQ(Decode({{"type", "ByteLevel"}}, {"\u0120a", "\u00e4\u00bd"}),
            " a\uFFFD");
}

// Writes `j` to a temp file and loads it.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadJson(const json& j) {
  const std::string path =
      ::testing::TempDir() + "/tok_" +
      ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
  std::ofstream(path) << j.dump();
  return Tokenizer::Load(path);
}

json TinyTokenizer(const json& added) {
  return {{"model",
           {{"type", "BPE"},
            {"vocab",
             {{"a", 0},
              {"b", 1},
              {" ", 2},
              {"x", 3},
              {"h", 5},
              {"i", 6},
              {"ab", 7}}},
            {"merges", json::array({"a b"})}}},
          {"normalizer", {{"type", "Lowercase"}}},
          {"added_tokens", added}};
}

json Added(const std::string& content, int id, bool lstrip, bool rstrip,
           bool single_word, bool normalized) {
  return {{"content", content},
          {"id", id},
          {"lstrip", lstrip},
          {"rstrip", rstrip},
          {"single_word", single_word},
          {"normalized", normalized},
          {"special", true}};
}

TEST(AddedTokens, StripSingleWordNormalized) {
  auto plain = LoadJson(TinyTokenizer(
      json::array({Added("<m>", 4, false, false, false, false)})));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->Encode("a <m> b", false).value(),
            (std::vector<int32_t>{0, 2, 4, 2, 1}));
  auto strip = LoadJson(
      TinyTokenizer(json::array({Added("<m>", 4, true, true, false, false)})));
  ASSERT_TRUE(strip.ok()) << strip.status();
  EXPECT_EQ((*strip)->Encode("a  <m> b", false).value(),
            (std::vector<int32_t>{0, 4, 1}));
  auto single = LoadJson(
      TinyTokenizer(json::array({Added("hi", 8, false, false, true, false)})));
  ASSERT_TRUE(single.ok());
  EXPECT_EQ((*single)->Encode("xhi hi", false).value(),
            (std::vector<int32_t>{3, 5, 6, 2, 8}));
  // normalized=true tokens match the lowercased text; raw ones do not.
  auto norm = LoadJson(
      TinyTokenizer(json::array({Added("hi", 8, false, false, false, true)})));
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ((*norm)->Encode("HI ab", false).value(),
            (std::vector<int32_t>{8, 2, 7}));
  auto raw = LoadJson(
      TinyTokenizer(json::array({Added("hi", 8, false, false, false, false)})));
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ((*raw)->Encode("HI ab", false).value(),
            (std::vector<int32_t>{5, 6, 2, 7}));
  EXPECT_EQ((*raw)->Decode({8, 2, 7}, true).value(), "  ab");
}

TEST(Load, ErrorsNameTheProblem) {
  json j = TinyTokenizer(json::array());
  j["normalizer"] = {{"type", "BertNormalizer"}};
  auto bad = LoadJson(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("BertNormalizer"), std::string::npos);
  j = TinyTokenizer(json::array());
  j["model"]["type"] = "Unigram";
  bad = LoadJson(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("Unigram"), std::string::npos);
  j = TinyTokenizer(json::array());
  j["model"]["merges"] = json::array({"a zz"});
  bad = LoadJson(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("zz"), std::string::npos);
  j = TinyTokenizer(json::array());
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"}};
  bad = LoadJson(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string::npos);
}

TEST(Load, TruncatedFileIsInvalidArgument) {
  std::ifstream in("tests/data/tokenizers/gpt2/tokenizer.json");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 1000u);
  const std::string path = ::testing::TempDir() + "/truncated.json";
  std::ofstream(path) << text.substr(0, text.size() / 2);
  auto tok = Tokenizer::Load(path);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tok.status().message().find("truncated.json"), std::string::npos);
}

TEST(Regex, OnigurumaTranslation) {
  EXPECT_EQ(OnigurumaToPcre2("\\s+(?!\\S)"),
            "[\\t-\\r\\x{85}\\p{Z}]+(?![^\\t-\\r\\x{85}\\p{Z}])");
  EXPECT_EQ(OnigurumaToPcre2("[^\\s\\p{L}]"), "[^\\t-\\r\\x{85}\\p{Z}\\p{L}]");
  EXPECT_EQ(OnigurumaToPcre2("\\p{^L}"), "\\P{L}");
  // Llama-3's pattern compiles (case-insensitive group, possessive-free).
  EXPECT_TRUE(Regex::Compile(
                  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                  "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                  "\\s+(?!\\S)|\\s+")
                  .ok());
  // NBSP and U+3000 are \s for Oniguruma.
  auto re = Regex::Compile("\\s+").value();
  std::vector<MatchPiece> m;
  re->FindMatches("a\u00a0\u3000b", &m);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_TRUE(m[1].is_match);
}

}  // namespace
}  // namespace pdserve::tok
