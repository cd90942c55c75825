// The HTTP API tests' fixture: one cluster (router with its HTTP API, one
// prefill and two decode workers on loopback) per test executable, with
// helpers to post JSON, read a streamed completion and ask gRPC for the
// same prompt scores. Used from the test thread only.
#ifndef PDSERVE_TESTS_INTEGRATION_HTTP_API_FIXTURE_H_
#define PDSERVE_TESTS_INTEGRATION_HTTP_API_FIXTURE_H_

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/http_test_client.h"

namespace pdserve::testing {

using nlohmann::json;

// The output ids of a completion sent with return_tokens_as_token_ids.
inline std::vector<int32_t> IdsOf(const json& logprob_tokens) {
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
    o.common_flags = {"--metrics_port=-1"};
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

  // Prompt tokens the workers computed so far (all of them), once the
  // counters stopped moving (a step's counters follow its tokens).
  static double ComputedPromptTokens() {
    auto read = [] {
      double sum = 0;
      for (int i = 0; i < cluster_->num_prefill(); ++i) {
        sum += ScrapeRole(cluster_->prefill(i))
                   .Sum("pdserve_prefill_computed_tokens_total");
      }
      for (int i = 0; i < cluster_->num_decode(); ++i) {
        sum += ScrapeRole(cluster_->decode(i))
                   .Sum("pdserve_prefill_computed_tokens_total");
      }
      return sum;
    };
    double last = read();
    for (int i = 0; i < 20; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      const double now = read();
      if (now == last) break;
      last = now;
    }
    return last;
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

  inline static Cluster* cluster_ = nullptr;
  inline static int port_ = 0;
  inline static std::vector<ReferenceCase> cases_;
};

}  // namespace pdserve::testing

#endif  // PDSERVE_TESTS_INTEGRATION_HTTP_API_FIXTURE_H_
