// The router's OpenAI-compatible HTTP API against a real cluster (router +
// prefill + decode processes on loopback), spoken to with raw sockets so
// that the bytes on the wire are checked: output equal to the reference
// (= gRPC = `pdserve complete`), SSE framing, sampling parameters, the
// error shapes and codes, models, health and version. Connections
// (pipelining, half-closes, disconnects, hostile clients, 429):
// service_http_connections_test.cc; logprobs: service_http_logprobs_test.cc.
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/util/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/http_api_fixture.h"
#include "tests/integration/http_test_client.h"

namespace pdserve::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

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
      "This model's maximum context length is ", "max_tokens");
  // Past the router's max_tokens cap (4096) too: the context is what a
  // client can act on, and the sum does not overflow.
  expect_error("POST", "/v1/completions",
               R"({"prompt": "hi", "max_tokens": 2147483647})", 400,
               "However, you requested 2147483650 tokens (3 in the prompt, "
               "2147483647 in the completion)",
               "max_tokens");
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
  EXPECT_EQ(post->Header("Allow"), "GET, HEAD");
  auto health = HttpRequest(port_, "GET", "/health");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 200) << health->body;
  // vLLM's /version, the version `pdserve version` prints.
  auto version = HttpRequest(port_, "GET", "/version");
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(version->status, 200) << version->body;
  EXPECT_EQ(json::parse(version->body, nullptr, false),
            json({{"version", kPdserveVersion}}))
      << version->body;
}

}  // namespace
}  // namespace pdserve::testing
