// The router's OpenAI-compatible HTTP API against a real cluster (router +
// prefill + decode processes on loopback), spoken to with raw sockets so
// that the bytes on the wire are checked: output equal to the reference
// (= gRPC = `pdserve complete`), SSE framing, the error shapes and codes,
// 429 with Retry-After, clients that disconnect mid-stream (no KV left in
// use), and malformed or hostile clients (garbage, huge headers, slow-loris)
// that must not hurt the others.
#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/http_test_client.h"

namespace pdserve::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// The output ids of a completion sent with return_tokens_as_token_ids.
std::vector<int32_t> IdsOf(const json& logprob_tokens) {
  std::vector<int32_t> ids;
  for (const json& t : logprob_tokens) {
    const std::string s = t.get<std::string>();
    ids.push_back(std::stoi(s.substr(std::string("token_id:").size())));
  }
  return ids;
}

class HttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions o;
    o.prefill = 1;
    o.decode = 2;
    o.router_flags = {"--http_request_timeout=2s", "--http_idle_timeout=5s",
                      "--http_max_body_bytes=65536"};
    auto c = Cluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
    port_ = cluster_->router_process().http_port;
    ASSERT_GT(port_, 0) << "the router announced no HTTP port";
    cases_ = LoadReferenceCases();
    ASSERT_FALSE(cases_.empty());
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  static json Post(const std::string& path, const json& body, int want_status) {
    auto reply = HttpRequest(port_, "POST", path, body.dump());
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return json();
    EXPECT_EQ(reply->status, want_status) << reply->body;
    EXPECT_EQ(reply->Header("Content-Type"), "application/json");
    return json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  }

  // gRPC's prompt_logprobs of `ids` with k alternatives (empty on error).
  static std::vector<v1::GeneratedToken> GrpcPromptScores(
      const std::vector<int32_t>& ids, int k) {
    v1::GenerateRequest req = IdsRequest(ids, 1);
    req.set_prompt_logprobs(k);
    auto g = RunGenerate(cluster_->router(), req, absl::Seconds(60));
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? g->prompt_logprobs : std::vector<v1::GeneratedToken>();
  }

  static json EmptyLogprobs() {
    return {{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  }

  // The data chunks of a streamed completion (200, before "[DONE]").
  static std::vector<json> StreamChunks(const json& body) {
    std::vector<json> chunks;
    auto reply = HttpRequest(port_, "POST", "/v1/completions", body.dump());
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return chunks;
    EXPECT_EQ(reply->status, 200) << reply->body;
    auto events = ParseSseEvents(reply->body);
    EXPECT_TRUE(events.ok()) << events.status() << "\n" << reply->body;
    if (!events.ok()) return chunks;
    EXPECT_TRUE(!events->empty() && events->back() == "[DONE]") << reply->body;
    for (size_t i = 0; i + 1 < events->size(); ++i) {
      chunks.push_back(json::parse((*events)[i]));
    }
    return chunks;
  }

  static Cluster* cluster_;
  static int port_;
  static std::vector<ReferenceCase> cases_;
};
Cluster* HttpTest::cluster_ = nullptr;
int HttpTest::port_ = 0;
std::vector<ReferenceCase> HttpTest::cases_;

TEST_F(HttpTest, CompletionsReturnTheReferenceIdsAndText) {
  for (const ReferenceCase& c : cases_) {
    SCOPED_TRACE(c.prompt);
    // Token-id prompts: exactly the reference's input.
    json body = {{"model", "stories260K"},
                 {"prompt", c.prompt_ids},
                 {"max_tokens", c.max_new_tokens},
                 {"temperature", 0},
                 {"logprobs", 0},
                 {"return_tokens_as_token_ids", true}};
    json r = Post("/v1/completions", body, 200);
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_TRUE(absl::StartsWith(r["id"].get<std::string>(), "cmpl-"));
    EXPECT_EQ(IdsOf(r["choices"][0]["logprobs"]["tokens"]), c.output_ids);
    EXPECT_EQ(r["usage"]["prompt_tokens"], c.prompt_ids.size());
    EXPECT_EQ(r["usage"]["completion_tokens"], c.output_ids.size());
    EXPECT_EQ(r["usage"]["total_tokens"],
              c.prompt_ids.size() + c.output_ids.size());
    // The same over gRPC, text for text.
    auto g = RunGenerate(cluster_->router(),
                         IdsRequest(c.prompt_ids, c.max_new_tokens),
                         absl::Seconds(60));
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(r["choices"][0]["text"], g->text);
  }
}

TEST_F(HttpTest, StreamingIsByteExactSseAndEqualsTheWholeResponse) {
  const ReferenceCase& c = cases_[0];
  json body = {{"prompt", c.prompt_ids},
               {"max_tokens", c.max_new_tokens},
               {"temperature", 0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"logprobs", 0},
               {"return_tokens_as_token_ids", true}};
  auto reply = HttpRequest(port_, "POST", "/v1/completions", body.dump());
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->status, 200) << reply->body;
  EXPECT_EQ(reply->Header("Content-Type"), "text/event-stream");
  EXPECT_EQ(reply->Header("Transfer-Encoding"), "chunked");
  auto events = ParseSseEvents(reply->body);
  ASSERT_TRUE(events.ok()) << events.status() << "\n" << reply->body;
  ASSERT_GE(events->size(), 3u);
  EXPECT_EQ(events->back(), "[DONE]");
  std::string text;
  std::vector<int32_t> ids;
  std::string finish;
  for (size_t i = 0; i + 2 < events->size(); ++i) {
    json chunk = json::parse((*events)[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_TRUE(chunk["usage"].is_null());
    const json& choice = chunk["choices"][0];
    text += choice["text"].get<std::string>();
    for (int32_t id : IdsOf(choice["logprobs"]["tokens"])) ids.push_back(id);
    if (!choice["finish_reason"].is_null()) {
      EXPECT_TRUE(finish.empty()) << "two finish reasons";
      finish = choice["finish_reason"];
    }
  }
  EXPECT_EQ(ids, c.output_ids);
  EXPECT_FALSE(finish.empty());
  json usage_chunk = json::parse((*events)[events->size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], c.output_ids.size());
  // The whole (non-streamed) response has the same text.
  body.erase("stream");
  body.erase("stream_options");
  json whole = Post("/v1/completions", body, 200);
  EXPECT_EQ(whole["choices"][0]["text"], text);
}

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

TEST_F(HttpTest, EmptyPromptGeneratesFromBosAlone) {
  json r = Post("/v1/completions",
                {{"prompt", ""},
                 {"max_tokens", 8},
                 {"temperature", 0},
                 {"logprobs", 0},
                 {"return_tokens_as_token_ids", true}},
                200);
  ASSERT_TRUE(r.contains("usage")) << r.dump();
  EXPECT_EQ(r["usage"]["prompt_tokens"], 1);  // BOS
  json from_bos = Post("/v1/completions",
                       {{"prompt", json::array({1})},
                        {"max_tokens", 8},
                        {"temperature", 0},
                        {"logprobs", 0},
                        {"return_tokens_as_token_ids", true}},
                       200);
  EXPECT_EQ(IdsOf(r["choices"][0]["logprobs"]["tokens"]),
            IdsOf(from_bos["choices"][0]["logprobs"]["tokens"]));
}

// A stop string is trimmed, or kept with include_stop_str_in_output (vLLM's
// extra), streamed or not.
TEST_F(HttpTest, IncludeStopStrInOutputKeepsTheStopString) {
  const ReferenceCase& c = cases_[0];
  json body = {{"prompt", c.prompt_ids},
               {"max_tokens", c.max_new_tokens},
               {"temperature", 0}};
  const std::string text =
      Post("/v1/completions", body, 200)["choices"][0]["text"];
  ASSERT_GT(text.size(), 20u) << text;
  const std::string stop = text.substr(12, 5);
  const size_t at = text.find(stop);
  body["stop"] = stop;
  json trimmed = Post("/v1/completions", body, 200);
  EXPECT_EQ(trimmed["choices"][0]["text"], text.substr(0, at));
  EXPECT_EQ(trimmed["choices"][0]["finish_reason"], "stop");
  body["include_stop_str_in_output"] = true;
  json kept = Post("/v1/completions", body, 200);
  EXPECT_EQ(kept["choices"][0]["text"], text.substr(0, at + stop.size()));
  EXPECT_EQ(kept["choices"][0]["finish_reason"], "stop");
  body["stream"] = true;
  auto reply = HttpRequest(port_, "POST", "/v1/completions", body.dump());
  ASSERT_TRUE(reply.ok()) << reply.status();
  auto events = ParseSseEvents(reply->body);
  ASSERT_TRUE(events.ok()) << events.status();
  std::string streamed;
  for (const std::string& e : *events) {
    if (e == "[DONE]") break;
    streamed += json::parse(e)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, text.substr(0, at + stop.size()));
}

// logit_bias as OpenAI takes it ({"token id": bias}): -100 bans greedy's
// token, 100 forces one; bad entries are 400 naming logit_bias.
TEST_F(HttpTest, LogitBiasBansAndForcesTokens) {
  const ReferenceCase& c = cases_[0];
  json body = {{"prompt", c.prompt_ids},
               {"max_tokens", 6},
               {"temperature", 0},
               {"logprobs", 0},
               {"return_tokens_as_token_ids", true}};
  body["logit_bias"] = {{std::to_string(c.output_ids[0]), -100}};
  json banned = Post("/v1/completions", body, 200);
  const std::vector<int32_t> ids =
      IdsOf(banned["choices"][0]["logprobs"]["tokens"]);
  ASSERT_EQ(ids.size(), 6u) << banned.dump();
  EXPECT_NE(ids[0], c.output_ids[0]);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), c.output_ids[0]), 0);
  body["logit_bias"] = {{"300", 100}};
  json forced = Post("/v1/completions", body, 200);
  EXPECT_EQ(IdsOf(forced["choices"][0]["logprobs"]["tokens"]),
            std::vector<int32_t>(6, 300));
  // eos (2) forced ends the output at once, unless min_tokens holds it.
  body["logit_bias"] = {{"2", 100}};
  for (int min_tokens : {0, 3}) {
    body["min_tokens"] = min_tokens;
    json r = Post("/v1/completions", body, 200);
    EXPECT_EQ(r["usage"]["completion_tokens"], min_tokens) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
  }
  body.erase("min_tokens");
  for (const json& bad : {json{{"x", 1}}, json{{"999999", 1}}, json{{"5", 101}},
                          json{{"5", "high"}}, json(3)}) {
    body["logit_bias"] = bad;
    json e = Post("/v1/completions", body, 400);
    EXPECT_EQ(e["error"]["param"], "logit_bias") << e.dump();
  }
}

TEST_F(HttpTest, NChoicesAndSeedsAreSingleRequestsWithDerivedSeeds) {
  json body = {{"prompt", "Once upon a time"},
               {"max_tokens", 24},
               {"temperature", 1.5},
               {"seed", 41},
               {"n", 3},
               {"logprobs", 0},
               {"return_tokens_as_token_ids", true}};
  json r = Post("/v1/completions", body, 200);
  ASSERT_EQ(r["choices"].size(), 3u) << r.dump();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    json single = body;
    single["n"] = 1;
    single["seed"] = 41 + i;
    json s = Post("/v1/completions", single, 200);
    EXPECT_EQ(s["choices"][0]["text"], r["choices"][i]["text"]) << i;
  }
  // Different seeds: at this temperature the three differ.
  EXPECT_FALSE(r["choices"][0]["text"] == r["choices"][1]["text"] &&
               r["choices"][1]["text"] == r["choices"][2]["text"]);
}

TEST_F(HttpTest, ErrorsHaveTheOpenAiShapeAndStatus) {
  // `param`: the error's "param" ("-": not checked; "": null).
  auto expect_error = [&](const std::string& method, const std::string& path,
                          const std::string& body, int status,
                          const std::string& message_part,
                          const std::string& param = "-") {
    SCOPED_TRACE(absl::StrCat(method, " ", path, " ", body.substr(0, 80)));
    auto reply = HttpRequest(port_, method, path, body);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->status, status) << reply->body;
    json e = json::parse(reply->body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << reply->body;
    for (const char* key : {"message", "type", "param", "code"}) {
      EXPECT_TRUE(e["error"].contains(key)) << key;
    }
    EXPECT_THAT(e["error"]["message"].get<std::string>(),
                HasSubstr(message_part));
    if (param != "-") {
      EXPECT_EQ(e["error"]["param"], param.empty() ? json() : json(param));
    }
  };
  expect_error("POST", "/v1/completions",
               R"({"model": "gpt-4", "prompt": "hi"})", 404, "gpt-4", "model");
  // The pipeline's own messages, as gRPC gives them, naming the parameter.
  expect_error("POST", "/v1/completions",
               R"({"prompt": "hi", "temperature": -1})", 400,
               "temperature must be >= 0", "temperature");
  expect_error(
      "POST", "/v1/completions",
      json{{"prompt", std::string(3000, 'a')}, {"max_tokens", 10}}.dump(), 400,
      "exceeds the model context", "max_tokens");
  expect_error("POST", "/v1/completions",
               R"({"prompt": "hi", "presence_penalty": 3, "stream": true})",
               400, "presence_penalty must be in [-2, 2]", "presence_penalty");
  expect_error("POST", "/v1/completions", R"({"prompt": "hi", "logprobs": 50})",
               400, "'logprobs' must be in [0, 20]", "logprobs");
  expect_error("POST", "/v1/completions", R"({"prompt": [999999]})", 400,
               "outside the vocabulary", "prompt");
  expect_error("POST", "/v1/completions", R"({"prompt": "hi", "top_p": 0})",
               400, "top_p must be in (0, 1]", "top_p");
  expect_error("GET", "/v1/nothing", "", 404, "no such endpoint", "");
  expect_error("GET", "/v1/completions", "", 405, "not allowed");
  expect_error("POST", "/v1/completions", "{not json", 400, "not valid JSON");
  expect_error("POST", "/v1/completions", R"({"prompt": 5})", 400, "'prompt'");
  expect_error("POST", "/v1/completions",
               R"({"prompt": "hi", "max_tokens": "x"})", 400,
               "'max_tokens' must be an integer");
  expect_error("POST", "/v1/completions", "{\"prompt\": \"\xff\xfe\"}", 400,
               "not valid JSON");
  expect_error("POST", "/v1/completions", R"({"prompt": "hi", "suffix": "x"})",
               400, "'suffix' is not supported");
  expect_error(
      "POST", "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}})",
      400, "'response_format' is not supported");
  expect_error("POST", "/v1/completions",
               json{{"prompt", std::string(70000, 'a')}}.dump(), 413,
               "over the limit");
}

TEST_F(HttpTest, ModelsAndHealth) {
  auto models = HttpRequest(port_, "GET", "/v1/models");
  ASSERT_TRUE(models.ok());
  json m = json::parse(models->body);
  EXPECT_EQ(m["data"][0]["id"], "stories260K");
  EXPECT_EQ(m["data"][0]["max_model_len"], 512);
  // One model by id (the SDK's models.retrieve), percent-encoded or not.
  for (const char* path :
       {"/v1/models/stories260K", "/v1/models/stories%32%360K"}) {
    auto one = HttpRequest(port_, "GET", path);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(one->status, 200) << path << ": " << one->body;
    EXPECT_EQ(json::parse(one->body, nullptr, false), m["data"][0]) << path;
  }
  auto other = HttpRequest(port_, "GET", "/v1/models/org%2Fother");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->status, 404);
  json e = json::parse(other->body, nullptr, false);
  EXPECT_EQ(e["error"]["code"], "model_not_found") << other->body;
  EXPECT_NE(e["error"]["message"].get<std::string>().find("`org/other`"),
            std::string::npos)
      << other->body;
  auto post = HttpRequest(port_, "POST", "/v1/models/stories260K", "{}");
  ASSERT_TRUE(post.ok());
  EXPECT_EQ(post->status, 405);
  auto health = HttpRequest(port_, "GET", "/health");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 200) << health->body;
}

TEST_F(HttpTest, DisconnectsMidStreamLeaveNoKvInUse) {
  std::mt19937 rng(7);
  std::vector<std::thread> threads;
  std::atomic<int> cut{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, seed = rng()] {
      std::mt19937 r(seed);
      for (int i = 0; i < 25; ++i) {
        auto conn = RawHttpConnection::Connect(port_);
        if (!conn.ok()) continue;
        json body = {{"prompt", "Once upon a time"},
                     {"max_tokens", 200},
                     {"ignore_eos", true},
                     {"stream", true}};
        const std::string b = body.dump();
        (void)conn->SendBytes(absl::StrCat(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ",
            b.size(), "\r\n\r\n", b));
        // Read a random amount (possibly nothing), then close.
        const int reads = std::uniform_int_distribution<int>(0, 6)(r);
        for (int k = 0; k < reads; ++k) {
          (void)conn->ReadSome(std::uniform_int_distribution<int>(1, 400)(r),
                               absl::Milliseconds(500));
        }
        conn->Close();
        cut.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(cut.load(), 100);
  absl::Status no_kv = cluster_->WaitForNoKvInUse(absl::Seconds(20));
  EXPECT_TRUE(no_kv.ok()) << no_kv;
  // The cluster keeps serving.
  json r =
      Post("/v1/completions", {{"prompt", "The dog"}, {"max_tokens", 5}}, 200);
  EXPECT_EQ(r["usage"]["completion_tokens"], 5);
}

TEST_F(HttpTest, BadClientsAreAnsweredOrCutOffAndOthersUnaffected) {
  std::atomic<bool> stop{false};
  std::atomic<int> good{0}, bad{0};
  // A well-behaved client keeps asking while the others misbehave.
  std::thread well_behaved([&] {
    while (!stop.load()) {
      auto r = HttpRequest(port_, "POST", "/v1/completions",
                           R"({"prompt": "Tom", "max_tokens": 3})",
                           absl::Seconds(20));
      (r.ok() && r->status == 200 ? good : bad).fetch_add(1);
    }
  });
  std::mt19937 rng(11);
  // Random bytes.
  for (int i = 0; i < 20; ++i) {
    auto conn = RawHttpConnection::Connect(port_);
    ASSERT_TRUE(conn.ok());
    std::string junk(std::uniform_int_distribution<int>(1, 3000)(rng), '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    (void)conn->SendBytes(junk + "\r\n\r\n");
    auto reply = conn->ReadReply(absl::Seconds(5));
    if (reply.ok()) {
      EXPECT_GE(reply->status, 400) << reply->raw.substr(0, 200);
      EXPECT_LT(reply->status, 500);
    } else {
      EXPECT_TRUE(conn->WaitForClose(absl::Seconds(5)));
    }
  }
  // A 1 MB header: 431, connection closed.
  {
    auto conn = RawHttpConnection::Connect(port_);
    ASSERT_TRUE(conn.ok());
    (void)conn->SendBytes(absl::StrCat("GET /v1/models HTTP/1.1\r\nX-Big: ",
                                       std::string(1 << 20, 'a'), "\r\n\r\n"));
    auto reply = conn->ReadReply(absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->status, 431);
  }
  // A truncated request (body shorter than Content-Length): cut off at the
  // request timeout (2 s here).
  {
    auto conn = RawHttpConnection::Connect(port_);
    ASSERT_TRUE(conn.ok());
    (void)conn->SendBytes(
        "POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro");
    EXPECT_TRUE(conn->WaitForClose(absl::Seconds(10)));
  }
  // Slow-loris: header bytes trickling in; cut off after the request
  // timeout, while the other client was served all along.
  {
    auto conn = RawHttpConnection::Connect(port_);
    ASSERT_TRUE(conn.ok());
    const absl::Time start = absl::Now();
    bool closed = false;
    for (int i = 0; i < 40 && !closed; ++i) {
      closed = !conn->SendBytes("X-A: b\r\n").ok() ||
               conn->WaitForClose(absl::Milliseconds(250));
    }
    EXPECT_TRUE(closed);
    EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  }
  stop.store(true);
  well_behaved.join();
  EXPECT_GT(good.load(), 0);
  EXPECT_EQ(bad.load(), 0);
}

TEST(HttpOverloadTest, RouterFullGives429WithRetryAfter) {
  ClusterOptions o;
  o.router_flags = {"--max_in_flight=1", "--admission_queue=0",
                    "--retry_after_ms=1500"};
  auto c = Cluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  const int port = (*c)->router_process().http_port;
  std::atomic<int> ok{0}, limited{0};
  std::string retry_after;
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto r = HttpRequest(
          port, "POST", "/v1/completions",
          R"({"prompt": "Hi", "max_tokens": 100, "ignore_eos": true})");
      if (!r.ok()) return;
      if (r->status == 200) ok.fetch_add(1);
      if (r->status == 429) {
        limited.fetch_add(1);
        absl::MutexLock lock(&mu);
        retry_after = r->Header("Retry-After");
        EXPECT_THAT(r->body, HasSubstr("router overloaded"));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GE(ok.load(), 1);
  EXPECT_GE(limited.load(), 1);
  EXPECT_EQ(retry_after, "2");  // 1500 ms, in whole seconds rounded up
}

}  // namespace
}  // namespace pdserve::testing
