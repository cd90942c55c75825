// The HTTP API's logprobs against a real cluster (tests/integration/
// http_api_fixture.h): echo with logprobs scoring the prompt as gRPC's
// prompt_logprobs do (max_tokens 0: the prompt alone, up to the whole
// context), token texts read in context (concatenating to the text), and
// vLLM's prompt_logprobs extra with ranks, shared by the n choices of a
// prompt.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/http_api_fixture.h"

namespace pdserve::testing {
namespace {

// echo with logprobs (lm-eval-harness's loglikelihood requests): the
// logprobs list the prompt's tokens first, the first with null, each other
// scored by the ones before it exactly as gRPC's prompt_logprobs, then the
// generated ones; streamed, the first chunk carries the prompt's entries;
// with max_tokens 0, the prompt alone.
TEST_F(HttpTest, EchoWithLogprobsScoresThePromptTokens) {
  const ReferenceCase& c = cases_[1];
  json body = {{"prompt", c.prompt_ids}, {"max_tokens", 3},
               {"temperature", 0},       {"echo", true},
               {"logprobs", 2},          {"return_tokens_as_token_ids", true}};
  json r = Post("/v1/completions", body, 200);
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  const json& lp = r["choices"][0]["logprobs"];
  const size_t n = c.prompt_ids.size();
  ASSERT_EQ(lp["tokens"].size(), n + 3) << lp.dump();
  std::vector<int32_t> prompt_and_output = c.prompt_ids;
  prompt_and_output.insert(prompt_and_output.end(), c.output_ids.begin(),
                           c.output_ids.begin() + 3);
  EXPECT_EQ(IdsOf(lp["tokens"]), prompt_and_output);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["text_offset"][0], 0);
  for (size_t t = 1; t < n + 3; ++t) {
    ASSERT_TRUE(lp["token_logprobs"][t].is_number()) << t;
    EXPECT_LE(lp["token_logprobs"][t].get<double>(), 0.0) << t;
    EXPECT_EQ(lp["top_logprobs"][t].size(), 2u) << t;
    EXPECT_GE(lp["text_offset"][t].get<int64_t>(),
              lp["text_offset"][t - 1].get<int64_t>());
  }
  // The prompt's scores are gRPC's prompt_logprobs.
  const std::vector<v1::GeneratedToken> scores =
      GrpcPromptScores(c.prompt_ids, 2);
  ASSERT_EQ(scores.size(), n - 1);
  for (size_t t = 1; t < n; ++t) {
    EXPECT_EQ(lp["token_logprobs"][t].get<float>(), scores[t - 1].logprob())
        << t;
  }
  // Streamed: the same entries, the prompt's in the first chunk.
  body["stream"] = true;
  const std::vector<json> chunks = StreamChunks(body);
  ASSERT_FALSE(chunks.empty());
  json streamed = EmptyLogprobs();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const json& delta = chunks[i]["choices"][0]["logprobs"];
    if (i == 0) {
      EXPECT_GE(delta["tokens"].size(), n) << "first chunk";
    }
    for (const char* key :
         {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (const json& v : delta[key]) streamed[key].push_back(v);
    }
  }
  EXPECT_EQ(streamed, lp);
  // max_tokens 0 (echo without generation): the prompt alone, scored.
  body.erase("stream");
  body["max_tokens"] = 0;
  json only = Post("/v1/completions", body, 200);
  const json& only_lp = only["choices"][0]["logprobs"];
  EXPECT_EQ(IdsOf(only_lp["tokens"]), c.prompt_ids) << only.dump();
  for (const char* key : {"token_logprobs", "top_logprobs", "text_offset"}) {
    EXPECT_EQ(only_lp[key],
              json(std::vector<json>(lp[key].begin(), lp[key].begin() + n)))
        << key;
  }
  EXPECT_EQ(only["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(only["usage"]["completion_tokens"], 0);
  EXPECT_EQ(only["usage"]["prompt_tokens"], n);
  body["stream"] = true;
  std::string only_text;
  std::vector<int32_t> only_ids;
  for (const json& chunk : StreamChunks(body)) {
    only_text += chunk["choices"][0]["text"].get<std::string>();
    for (int32_t id : IdsOf(chunk["choices"][0]["logprobs"]["tokens"])) {
      only_ids.push_back(id);
    }
  }
  EXPECT_EQ(only_text, only["choices"][0]["text"]);
  EXPECT_EQ(only_ids, c.prompt_ids);
  // Nothing is generated, so the prompt may fill the whole context (512),
  // as a perplexity window does; with logprobs or without.
  std::vector<int32_t> full;
  while (full.size() < 512) {
    full.insert(full.end(), c.prompt_ids.begin(), c.prompt_ids.end());
  }
  full.resize(512);
  json full_body = {{"prompt", full},   {"max_tokens", 0},
                    {"echo", true},     {"logprobs", 0},
                    {"temperature", 0}, {"return_tokens_as_token_ids", true}};
  json full_only = Post("/v1/completions", full_body, 200);
  EXPECT_EQ(IdsOf(full_only["choices"][0]["logprobs"]["tokens"]), full);
  EXPECT_EQ(full_only["usage"]["completion_tokens"], 0);
  full_body.erase("logprobs");
  json full_text = Post("/v1/completions", full_body, 200);
  EXPECT_EQ(full_text["choices"][0]["text"], full_only["choices"][0]["text"]);
  full_body["max_tokens"] = 1;  // one token more than the context
  EXPECT_EQ(Post("/v1/completions", full_body, 400)["error"]["param"],
            "max_tokens");
  // Without logprobs, echo stays text only; max_tokens 0 without echo is
  // refused.
  body.erase("stream");
  body.erase("logprobs");
  json plain = Post("/v1/completions", body, 200);
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null()) << plain.dump();
  EXPECT_EQ(plain["choices"][0]["text"], only["choices"][0]["text"]);
  body.erase("echo");
  json refused = Post("/v1/completions", body, 400);
  EXPECT_EQ(refused["error"]["param"], "max_tokens") << refused.dump();
}

// Logprob tokens are read in context: each is the text it adds after the
// tokens before it (a SentencePiece word keeps its leading space), so the
// tokens concatenate to the text, text_offset is each token's place in it,
// and an alternative reads as the chosen token does in the same place.
// Streamed and whole agree; with echo the prompt's tokens read the same way.
TEST_F(HttpTest, LogprobTokensAreReadInContextAndConcatenateToTheText) {
  auto code_points = [](const std::string& s) {
    int64_t n = 0;
    for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
    return n;
  };
  // Tokens from `first_generated` on are greedy's.
  auto check = [&](const json& choice, const std::string& want_text,
                   size_t first_generated) {
    const json& lp = choice["logprobs"];
    ASSERT_TRUE(lp.is_object()) << choice.dump();
    std::string joined;
    bool spaced = false;
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      const std::string token = lp["tokens"][i];
      EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), code_points(joined)) << i;
      spaced = spaced || (!token.empty() && token[0] == ' ');
      joined += token;
      // Greedy: the chosen token is the most likely alternative, read alike.
      if (i >= first_generated) {
        ASSERT_TRUE(lp["top_logprobs"][i].contains(token))
            << i << " " << lp["top_logprobs"][i].dump();
        EXPECT_EQ(lp["top_logprobs"][i][token], lp["token_logprobs"][i]) << i;
      }
    }
    EXPECT_EQ(joined, want_text);
    EXPECT_TRUE(spaced) << "no token kept its leading space: " << lp.dump();
  };
  json body = {{"prompt", "Once upon a time,"},
               {"max_tokens", 24},
               {"temperature", 0},
               {"ignore_eos", true},
               {"logprobs", 2}};
  json whole = Post("/v1/completions", body, 200);
  ASSERT_TRUE(whole.contains("choices")) << whole.dump();
  const std::string text = whole["choices"][0]["text"];
  // The first token's text needs the prompt as context: a word after ",".
  ASSERT_EQ(text.substr(0, 1), " ") << text;
  ASSERT_EQ(whole["choices"][0]["logprobs"]["tokens"].size(), 24u);
  check(whole["choices"][0], text, 0);
  body["stream"] = true;
  json streamed = {{"logprobs", EmptyLogprobs()}};
  std::string streamed_text;
  for (const json& chunk : StreamChunks(body)) {
    streamed_text += chunk["choices"][0]["text"].get<std::string>();
    const json& delta = chunk["choices"][0]["logprobs"];
    for (const char* key :
         {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (const json& v : delta[key]) streamed["logprobs"][key].push_back(v);
    }
  }
  EXPECT_EQ(streamed_text, text);
  EXPECT_EQ(streamed["logprobs"], whole["choices"][0]["logprobs"]);
  // Echo of a token-id prompt: its text is the prompt's decode (special
  // tokens included), then the output; the tokens concatenate to it.
  const ReferenceCase& c = cases_[1];
  body.erase("stream");
  body["prompt"] = c.prompt_ids;
  body["echo"] = true;
  json echoed = Post("/v1/completions", body, 200);
  ASSERT_TRUE(echoed.contains("choices")) << echoed.dump();
  EXPECT_EQ(echoed["choices"][0]["logprobs"]["tokens"].size(),
            c.prompt_ids.size() + 24);
  check(echoed["choices"][0], echoed["choices"][0]["text"],
        c.prompt_ids.size());
  // A character split over byte tokens (<0xE2> <0x82> <0xAC>: U+20AC) reads
  // whole on its last token, the others "".
  body["prompt"] = {1, 229, 133, 175};
  body["max_tokens"] = 4;
  json bytes = Post("/v1/completions", body, 200);
  ASSERT_TRUE(bytes.contains("choices")) << bytes.dump();
  const json& blp = bytes["choices"][0]["logprobs"];
  EXPECT_EQ(std::vector<json>(blp["tokens"].begin(), blp["tokens"].begin() + 4),
            (std::vector<json>{"<s>", "", "", "\xE2\x82\xAC"}))
      << blp.dump();
  EXPECT_EQ(std::vector<json>(blp["text_offset"].begin(),
                              blp["text_offset"].begin() + 5),
            (std::vector<json>{0, 3, 3, 3, 4}));
  check(bytes["choices"][0], bytes["choices"][0]["text"], 4);
}

// vLLM's prompt_logprobs extra (chat: in sdk_test.mjs): per completion
// choice, null first, then for each prompt token {"<id>": {"logprob", "rank",
// "decoded_token"}} with the token itself and the K most likely; equal to
// gRPC's prompt_logprobs, the texts to echo's; refused with stream.
TEST_F(HttpTest, PromptLogprobsHaveVllmsShapeAndRanks) {
  const ReferenceCase& c = cases_[1];
  const size_t n = c.prompt_ids.size();
  json body = {{"prompt", c.prompt_ids}, {"max_tokens", 1}, {"temperature", 0},
               {"prompt_logprobs", 20},  {"echo", true},    {"logprobs", 0}};
  json r = Post("/v1/completions", body, 200);
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  const json& pl = r["choices"][0]["prompt_logprobs"];
  const json& echo_tokens = r["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(pl.size(), n) << pl.dump();
  EXPECT_TRUE(pl[0].is_null());
  const std::vector<v1::GeneratedToken> scores =
      GrpcPromptScores(c.prompt_ids, 20);
  ASSERT_EQ(scores.size(), n - 1);
  for (size_t t = 1; t < n; ++t) {
    SCOPED_TRACE(t);
    const v1::GeneratedToken& want = scores[t - 1];
    const std::string id = std::to_string(c.prompt_ids[t]);
    ASSERT_TRUE(pl[t].contains(id)) << pl[t].dump();
    EXPECT_EQ(pl[t][id]["logprob"].get<float>(), want.logprob());
    EXPECT_EQ(pl[t][id]["rank"], want.rank());
    EXPECT_EQ(pl[t][id]["decoded_token"], echo_tokens[t]);
    // The token's rank is its place among the alternatives (when there).
    ASSERT_EQ(want.top_logprobs_size(), 20);
    int place = 0;
    for (int i = 0; i < 20; ++i) {
      const v1::TopLogprob& alt = want.top_logprobs(i);
      const std::string key = std::to_string(alt.token_id());
      ASSERT_TRUE(pl[t].contains(key));
      EXPECT_EQ(pl[t][key]["logprob"].get<float>(), alt.logprob());
      if (alt.token_id() == c.prompt_ids[t]) {
        place = i + 1;
      } else {
        EXPECT_EQ(pl[t][key]["rank"], i + 1);
      }
    }
    if (place > 0) {
      EXPECT_EQ(want.rank(), place);
      EXPECT_EQ(pl[t].size(), 20u);
    } else {
      EXPECT_GT(want.rank(), 20);
      EXPECT_EQ(pl[t].size(), 21u);
    }
  }
  // K = 0: the prompt token alone.
  body["prompt_logprobs"] = 0;
  json zero = Post("/v1/completions", body, 200);
  for (size_t t = 1; t < n; ++t) {
    EXPECT_EQ(zero["choices"][0]["prompt_logprobs"][t].size(), 1u) << t;
  }
  // Refused: with stream, and out of range.
  body["stream"] = true;
  EXPECT_EQ(Post("/v1/completions", body, 400)["error"]["param"],
            "prompt_logprobs");
  body.erase("stream");
  body["prompt_logprobs"] = 21;
  EXPECT_EQ(Post("/v1/completions", body, 400)["error"]["param"],
            "prompt_logprobs");
}

// n > 1: every choice of a prompt carries the same prompt scores (echo's
// entries and vLLM's prompt_logprobs, equal to gRPC's), computed once: the
// other choices reuse the first one's and its cached prefix rather than
// computing the whole prompt again (scoring reuses no cached prefix).
TEST_F(HttpTest, ChoicesOfAPromptShareItsScores) {
  const ReferenceCase& c = cases_[1];
  std::vector<int32_t> prompt = c.prompt_ids;  // long enough for full blocks
  prompt.insert(prompt.end(), c.output_ids.begin(), c.output_ids.end());
  const size_t n = prompt.size();
  ASSERT_GE(n, 64u);
  constexpr int kChoices = 3;
  const json body = {{"prompt", prompt},
                     {"max_tokens", 2},
                     {"n", kChoices},
                     {"temperature", 1},
                     {"seed", 11},
                     {"echo", true},
                     {"logprobs", 1},
                     {"prompt_logprobs", 2},
                     {"return_tokens_as_token_ids", true}};
  const double before = ComputedPromptTokens();
  const json r = Post("/v1/completions", body, 200);
  const double computed = ComputedPromptTokens() - before;
  ASSERT_EQ(r["choices"].size(), static_cast<size_t>(kChoices)) << r.dump();
  const json& first = r["choices"][0];
  ASSERT_EQ(first["prompt_logprobs"].size(), n);
  const std::vector<v1::GeneratedToken> scores = GrpcPromptScores(prompt, 2);
  ASSERT_EQ(scores.size(), n - 1);
  for (size_t t = 1; t < n; ++t) {
    EXPECT_EQ(first["prompt_logprobs"][t][std::to_string(prompt[t])]["logprob"]
                  .get<float>(),
              scores[t - 1].logprob())
        << t;
  }
  for (int i = 0; i < kChoices; ++i) {
    SCOPED_TRACE(i);
    const json& choice = r["choices"][i];
    EXPECT_EQ(choice["prompt_logprobs"], first["prompt_logprobs"]);
    const json& lp = choice["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), n + 2) << lp.dump();
    std::vector<int32_t> ids = IdsOf(lp["tokens"]);
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + n), prompt);
    for (const char* list : {"token_logprobs", "top_logprobs", "text_offset"}) {
      for (size_t t = 0; t < n; ++t) {
        EXPECT_EQ(lp[list][t], first["logprobs"][list][t]) << list << " " << t;
      }
    }
  }
  // The first choice computed the prompt; the others at most their last
  // partial block each (before: all three computed all of it).
  EXPECT_GE(computed, static_cast<double>(n));
  EXPECT_LT(computed, 1.5 * static_cast<double>(n));

  // Prompt-only (max_tokens 0, nothing sampled): one run for all choices,
  // streamed or not, each choice the same.
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    json only = body;
    only["max_tokens"] = 0;
    only.erase("prompt_logprobs");  // not with stream; echo's scores are
    const double before_only = ComputedPromptTokens();
    json whole;
    if (stream) {
      only["stream"] = true;
      const std::vector<json> chunks = StreamChunks(only);
      whole = {{"choices", json::array()}};
      for (int i = 0; i < kChoices; ++i) {
        whole["choices"].push_back({{"text", ""}, {"tokens", json::array()}});
      }
      for (const json& chunk : chunks) {
        for (const json& ch : chunk["choices"]) {
          json& w = whole["choices"][ch["index"].get<int>()];
          w["text"] =
              w["text"].get<std::string>() + ch["text"].get<std::string>();
          for (const json& t : ch["logprobs"]["tokens"])
            w["tokens"].push_back(t);
          if (!ch["finish_reason"].is_null()) {
            w["finish_reason"] = ch["finish_reason"];
          }
        }
      }
    } else {
      const json r0 = Post("/v1/completions", only, 200);
      ASSERT_EQ(r0["choices"].size(), static_cast<size_t>(kChoices));
      EXPECT_EQ(r0["usage"]["prompt_tokens"], n);
      EXPECT_EQ(r0["usage"]["completion_tokens"], 0);
      whole = {{"choices", json::array()}};
      for (const json& ch : r0["choices"]) {
        whole["choices"].push_back({{"text", ch["text"]},
                                    {"tokens", ch["logprobs"]["tokens"]},
                                    {"finish_reason", ch["finish_reason"]}});
      }
    }
    EXPECT_EQ(ComputedPromptTokens() - before_only, static_cast<double>(n));
    for (int i = 0; i < kChoices; ++i) {
      const json& ch = whole["choices"][i];
      EXPECT_EQ(ch["finish_reason"], "length") << i;
      EXPECT_EQ(IdsOf(ch["tokens"]), prompt) << i;
      EXPECT_EQ(ch["text"], whole["choices"][0]["text"]) << i;
    }
  }
}

}  // namespace
}  // namespace pdserve::testing
