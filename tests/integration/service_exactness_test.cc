// Exactness of the disaggregated service against the bundled reference, in
// every routing mode, at concurrency 1 and 16; seeded sampling identical
// across modes and to `pdserve complete`, with a logit_bias and min_tokens
// too; prompt logprobs identical across modes and to `pdserve complete`;
// and proof that the KV really moves (worker counters).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

class ExactnessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions o;
    o.prefill = 2;
    o.decode = 2;
    o.modes = {"disaggregated", "colocated", "auto"};
    auto c = Cluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
    cases_ = LoadReferenceCases();
    ASSERT_FALSE(cases_.empty());
  }
  static void TearDownTestSuite() {
    delete cluster_;  // kills every process
    cluster_ = nullptr;
  }

  // Runs `requests` on router `r` with `concurrency` threads.
  static std::vector<absl::StatusOr<GenerateResult>> RunAll(
      int r, const std::vector<v1::GenerateRequest>& requests,
      int concurrency) {
    std::vector<absl::StatusOr<GenerateResult>> out(
        requests.size(), absl::UnknownError("not run"));
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < concurrency; ++t) {
      threads.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < requests.size();) {
          out[i] =
              RunGenerate(cluster_->router(r), requests[i], absl::Seconds(60));
        }
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  // `pdserve complete --input_jsonl` of one request line: its output ids.
  // `pdserve complete`'s JSON result for one JSONL request line.
  static absl::StatusOr<nlohmann::json> CompleteJsonLine(
      const nlohmann::json& line, std::vector<std::string> extra_flags = {}) {
    TempDir dir;
    const std::string input = dir.path() + "/request.jsonl";
    std::ofstream(input) << line.dump() << "\n";
    extra_flags.push_back("--input_jsonl=" + input);
    return CompleteJson(extra_flags);
  }
  static absl::StatusOr<std::vector<int32_t>> CompleteLine(
      const nlohmann::json& line) {
    auto j = CompleteJsonLine(line);
    if (!j.ok()) return j.status();
    return (*j)["output_ids"].get<std::vector<int32_t>>();
  }

  static Cluster* cluster_;
  static std::vector<ReferenceCase> cases_;
};
Cluster* ExactnessTest::cluster_ = nullptr;
std::vector<ReferenceCase> ExactnessTest::cases_;

TEST_F(ExactnessTest, EveryModeReturnsTheReferenceAtConcurrency1And16) {
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("router mode #", r));
    for (int concurrency : {1, 16}) {
      SCOPED_TRACE(absl::StrCat("concurrency ", concurrency));
      std::vector<v1::GenerateRequest> reqs;
      std::vector<const ReferenceCase*> expected;
      const int n = concurrency == 1 ? static_cast<int>(cases_.size()) : 32;
      for (int i = 0; i < n; ++i) {
        const ReferenceCase& c = cases_[i % cases_.size()];
        reqs.push_back(IdsRequest(c.prompt_ids, c.max_new_tokens));
        expected.push_back(&c);
      }
      auto results = RunAll(r, reqs, concurrency);
      for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(results[i].ok()) << results[i].status() << cluster_->Logs();
        EXPECT_EQ(results[i]->output_ids, expected[i]->output_ids)
            << "request " << i;
        EXPECT_EQ(results[i]->prompt_ids, expected[i]->prompt_ids);
        EXPECT_EQ(results[i]->usage.completion_tokens(),
                  static_cast<int>(expected[i]->output_ids.size()));
      }
    }
  }
}

// A request id is the client's label, echoed back, not a key it must keep
// unique: two clients (or two routers' clients) may pick the same one. The
// same id, on different prompts at once through all three routers (which
// share both prefill and both decode workers), must give each request its
// own prompt's output: never another request's KV, never ALREADY_EXISTS.
TEST_F(ExactnessTest, ClientsMayReuseARequestIdConcurrently) {
  constexpr int kPerRouter = 16;
  struct Sent {
    int router;
    const ReferenceCase* expected;
    absl::StatusOr<GenerateResult> result = absl::UnknownError("not run");
  };
  std::vector<Sent> sent;
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < kPerRouter; ++i) {
      sent.push_back({r, &cases_[(r * kPerRouter + i) % cases_.size()]});
    }
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 24; ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < sent.size();) {
        v1::GenerateRequest req = IdsRequest(sent[i].expected->prompt_ids,
                                             sent[i].expected->max_new_tokens);
        req.set_request_id("same-id");
        sent[i].result = RunGenerate(cluster_->router(sent[i].router), req,
                                     absl::Seconds(60));
      }
    });
  }
  for (auto& t : threads) t.join();
  int failed = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " via router ", sent[i].router));
    if (!sent[i].result.ok()) {
      ++failed;
      ADD_FAILURE() << sent[i].result.status();
      continue;
    }
    EXPECT_EQ(sent[i].result->request_id, "same-id");
    EXPECT_EQ(sent[i].result->prompt_ids, sent[i].expected->prompt_ids);
    EXPECT_EQ(sent[i].result->output_ids, sent[i].expected->output_ids);
  }
  EXPECT_EQ(failed, 0) << cluster_->Logs();
  ASSERT_TRUE(cluster_->WaitForNoKvInUse(absl::Seconds(10)).ok());
}

TEST_F(ExactnessTest, TextPromptsMatchTheReference) {
  for (const ReferenceCase& c : cases_) {
    v1::GenerateRequest req;
    req.set_text(c.prompt);
    req.set_max_tokens(c.max_new_tokens);
    req.mutable_sampling()->set_temperature(0);
    auto result = RunGenerate(cluster_->router(0), req, absl::Seconds(60));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->prompt_ids, c.prompt_ids) << c.prompt;
    EXPECT_EQ(result->output_ids, c.output_ids) << c.prompt;
    EXPECT_FALSE(result->text.empty());
  }
}

TEST_F(ExactnessTest, SeededSamplingIsIdenticalInEveryModeAndToComplete) {
  for (const ReferenceCase& c : cases_) {
    v1::GenerateRequest req = IdsRequest(c.prompt_ids, 40);
    req.mutable_sampling()->set_temperature(0.8f);
    req.mutable_sampling()->set_top_p(0.9f);
    req.mutable_sampling()->set_seed(7);
    req.set_top_logprobs(2);
    std::vector<std::vector<int32_t>> outs;
    for (int r = 0; r < 3; ++r) {
      auto result = RunGenerate(cluster_->router(r), req, absl::Seconds(60));
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_EQ(result->top_logprobs.size(), result->output_ids.size());
      outs.push_back(result->output_ids);
    }
    EXPECT_EQ(outs[0], outs[1]) << "disaggregated vs colocated";
    EXPECT_EQ(outs[0], outs[2]) << "disaggregated vs auto";
    auto complete = CompleteOutputIds(
        c.prompt_ids,
        {"--max_tokens=40", "--temperature=0.8", "--top_p=0.9", "--seed=7"});
    ASSERT_TRUE(complete.ok()) << complete.status();
    EXPECT_EQ(*complete, outs[0]);
    // Sampling at temperature 0.8 must differ from greedy somewhere (the
    // seed matters), else this test would prove nothing.
    EXPECT_NE(
        std::vector<int32_t>(c.output_ids.begin(), c.output_ids.begin() + 40),
        outs[0]);
  }
}

// logit_bias applies on both legs (the prefill worker samples the first
// token): greedy and seeded outputs with a bias are identical in every mode
// and to `pdserve complete`, and the banned token never appears.
TEST_F(ExactnessTest, LogitBiasIsAppliedInEveryModeAndEqualsComplete) {
  const ReferenceCase& c = cases_[0];
  const int32_t banned = c.output_ids[0];  // greedy's first token
  const int32_t favoured = c.output_ids[3];
  for (const bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded" : "greedy");
    v1::GenerateRequest req = IdsRequest(c.prompt_ids, 24);
    if (seeded) {
      req.mutable_sampling()->set_temperature(0.8f);
      req.mutable_sampling()->set_seed(7);
    }
    (*req.mutable_sampling()->mutable_logit_bias())[banned] = -100.0f;
    (*req.mutable_sampling()->mutable_logit_bias())[favoured] = 2.5f;
    std::vector<std::vector<int32_t>> outs;
    for (int r = 0; r < 3; ++r) {
      auto result = RunGenerate(cluster_->router(r), req, absl::Seconds(60));
      ASSERT_TRUE(result.ok()) << result.status();
      outs.push_back(result->output_ids);
    }
    EXPECT_EQ(outs[0], outs[1]) << "disaggregated vs colocated";
    EXPECT_EQ(outs[0], outs[2]) << "disaggregated vs auto";
    EXPECT_EQ(std::count(outs[0].begin(), outs[0].end(), banned), 0);
    nlohmann::json line = {
        {"prompt_ids", c.prompt_ids},
        {"max_tokens", 24},
        {"logit_bias",
         {{std::to_string(banned), -100.0}, {std::to_string(favoured), 2.5}}}};
    if (seeded) {
      line["temperature"] = 0.8;
      line["seed"] = 7;
    }
    auto complete = CompleteLine(line);
    ASSERT_TRUE(complete.ok()) << complete.status();
    EXPECT_EQ(*complete, outs[0]);
  }
}

// min_tokens holds eos back on both legs (the prefill worker samples the
// first token): with eos forced by a logit bias the output is empty, and
// with min_tokens = 5 it is exactly 5 tokens, none of them eos, identical
// in every mode and to `pdserve complete`.
TEST_F(ExactnessTest, MinTokensHoldsEosBackInEveryModeAndEqualsComplete) {
  const ReferenceCase& c = cases_[1];
  constexpr int32_t kEos = 2;  // stories260K's generation config: [2, 1]
  for (const int min_tokens : {0, 1, 5}) {
    SCOPED_TRACE(absl::StrCat("min_tokens ", min_tokens));
    v1::GenerateRequest req = IdsRequest(c.prompt_ids, 24);
    (*req.mutable_sampling()->mutable_logit_bias())[kEos] = 100.0f;
    req.set_min_tokens(min_tokens);
    std::vector<std::vector<int32_t>> outs;
    for (int r = 0; r < 3; ++r) {
      auto result = RunGenerate(cluster_->router(r), req, absl::Seconds(60));
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->finish_reason, "stop");
      outs.push_back(result->output_ids);
    }
    EXPECT_EQ(outs[0].size(), static_cast<size_t>(min_tokens));
    EXPECT_EQ(std::count(outs[0].begin(), outs[0].end(), kEos), 0);
    EXPECT_EQ(std::count(outs[0].begin(), outs[0].end(), 1), 0);
    EXPECT_EQ(outs[0], outs[1]) << "disaggregated vs colocated";
    EXPECT_EQ(outs[0], outs[2]) << "disaggregated vs auto";
    auto complete = CompleteLine({{"prompt_ids", c.prompt_ids},
                                  {"max_tokens", 24},
                                  {"min_tokens", min_tokens},
                                  {"logit_bias", {{"2", 100.0}}}});
    ASSERT_TRUE(complete.ok()) << complete.status();
    EXPECT_EQ(*complete, outs[0]);
  }
}

// A scored token as plain values: (id, logprob, alternatives).
struct Scored {
  int32_t id;
  float logprob;
  int32_t rank;
  std::vector<std::pair<int32_t, float>> top;
  bool operator==(const Scored&) const = default;
};
std::vector<Scored> ScoresOf(const GenerateResult& r) {
  std::vector<Scored> out;
  for (const v1::GeneratedToken& t : r.prompt_logprobs) {
    Scored s{t.id(), t.logprob(), t.rank(), {}};
    for (const auto& a : t.top_logprobs()) {
      s.top.emplace_back(a.token_id(), a.logprob());
    }
    out.push_back(std::move(s));
  }
  return out;
}

// Prompt logprobs (what echo with logprobs returns over HTTP): each prompt
// token after the first scored by the ones before it, bit-identical in
// every mode (the prefill worker scores the prompt when it prefills it, the
// decode worker when it does), over a prompt longer than one scoring pass,
// and to `pdserve complete` (also chunked 7 tokens at a time); the scores
// of a generated continuation are the logprobs it was generated with (rank
// 1, greedy); a repeated request, whose prefix the workers hold cached, is
// scored in full.
TEST_F(ExactnessTest, PromptLogprobsAreIdenticalInEveryModeAndEqualComplete) {
  const ReferenceCase& c = cases_[2];
  constexpr int kTop = 3, kGen = 20;
  v1::GenerateRequest gen = IdsRequest(c.prompt_ids, kGen);
  gen.set_top_logprobs(kTop);
  auto generated = RunGenerate(cluster_->router(0), gen, absl::Seconds(60));
  ASSERT_TRUE(generated.ok()) << generated.status();
  ASSERT_EQ(generated->output_ids.size(), static_cast<size_t>(kGen));
  std::vector<int32_t> scored_prompt = c.prompt_ids;
  scored_prompt.insert(scored_prompt.end(), generated->output_ids.begin(),
                       generated->output_ids.end());
  std::vector<int32_t> long_prompt;  // 300 tokens: two scoring passes
  while (long_prompt.size() < 300) {
    long_prompt.insert(long_prompt.end(), scored_prompt.begin(),
                       scored_prompt.end());
  }
  long_prompt.resize(300);
  for (const auto& prompt : {scored_prompt, long_prompt}) {
    SCOPED_TRACE(absl::StrCat("prompt of ", prompt.size()));
    v1::GenerateRequest req = IdsRequest(prompt, 4);
    req.set_top_logprobs(kTop);
    req.set_prompt_logprobs(kTop);
    std::vector<std::vector<Scored>> scores;
    for (int round = 0; round < 2; ++round) {  // the second: prefix cached
      for (int r = 0; r < 3; ++r) {
        auto result = RunGenerate(cluster_->router(r), req, absl::Seconds(60));
        ASSERT_TRUE(result.ok()) << result.status();
        scores.push_back(ScoresOf(*result));
        EXPECT_EQ(scores.back(), scores[0]) << "router mode #" << r;
      }
    }
    ASSERT_EQ(scores[0].size(), prompt.size() - 1);
    for (size_t t = 0; t < scores[0].size(); ++t) {
      ASSERT_EQ(scores[0][t].id, prompt[t + 1]) << t;
      ASSERT_LE(scores[0][t].logprob, 0.0f) << t;
      ASSERT_EQ(scores[0][t].top.size(), static_cast<size_t>(kTop)) << t;
      ASSERT_GE(scores[0][t].rank, 1) << t;
    }
    if (prompt.size() == scored_prompt.size()) {
      // Greedy: each generated token is its own top alternative.
      for (int i = 0; i < kGen; ++i) {
        const Scored& s = scores[0][c.prompt_ids.size() - 1 + i];
        EXPECT_EQ(s.top, generated->top_logprobs[i]) << i;
        EXPECT_EQ(s.logprob, generated->top_logprobs[i][0].second) << i;
        EXPECT_EQ(s.rank, 1) << i;
      }
    }
    for (const auto& flags :
         {std::vector<std::string>{}, {"--prefill_chunk_tokens=7"}}) {
      auto complete = CompleteJsonLine({{"prompt_ids", prompt},
                                        {"max_tokens", 4},
                                        {"top_logprobs", kTop},
                                        {"prompt_logprobs", kTop}},
                                       flags);
      ASSERT_TRUE(complete.ok()) << complete.status();
      const nlohmann::json& pl = (*complete)["prompt_logprobs"];
      ASSERT_EQ(pl.size(), prompt.size());
      EXPECT_TRUE(pl[0].is_null());
      std::vector<Scored> from_complete;
      for (size_t t = 1; t < pl.size(); ++t) {
        Scored s{pl[t]["id"].get<int32_t>(),
                 pl[t]["logprob"].get<float>(),
                 pl[t]["rank"].get<int32_t>(),
                 {}};
        for (const auto& a : pl[t]["top_logprobs"]) {
          s.top.emplace_back(a[0].get<int32_t>(), a[1].get<float>());
        }
        from_complete.push_back(std::move(s));
      }
      EXPECT_EQ(from_complete, scores[0]);
    }
  }
}

// max_tokens 0 with prompt_logprobs (prompt-only): a prefill worker computes
// and scores the prompt (disaggregated and auto; a decode worker when
// colocated), reason "prompt_only", and nothing moves to a decode worker:
// no KV pushed, no token computed there; it generates nothing and ends with
// "length"; the scores are those of a generating request and of `pdserve
// complete`; the prompt may fill the whole context.
TEST_F(ExactnessTest, PromptOnlyRequestsAreScoredWhereThePromptIsComputed) {
  const ReferenceCase& c = cases_[2];
  constexpr int kTop = 3;
  constexpr size_t kContext = 512;  // stories260K's max_position_embeddings
  v1::GenerateRequest gen = IdsRequest(c.prompt_ids, 4);
  gen.set_prompt_logprobs(kTop);
  auto generating = RunGenerate(cluster_->router(0), gen, absl::Seconds(60));
  ASSERT_TRUE(generating.ok()) << generating.status();
  const std::vector<Scored> want = ScoresOf(*generating);
  ASSERT_EQ(want.size(), c.prompt_ids.size() - 1);
  std::vector<int32_t> full;  // the whole context
  while (full.size() < kContext) {
    full.insert(full.end(), c.prompt_ids.begin(), c.prompt_ids.end());
  }
  full.resize(kContext);
  // Tokens each role computed and KV bytes pushed, over all workers.
  struct Counters {
    int64_t p_tokens = 0, d_tokens = 0, pushed = 0;
  };
  auto counters = [] {
    Counters n;
    for (int i = 0; i < cluster_->num_prefill(); ++i) {
      auto p = cluster_->Status(cluster_->prefill(i));
      EXPECT_TRUE(p.ok()) << p.status();
      if (!p.ok()) continue;
      n.p_tokens += p->prefill_tokens_computed();
      n.pushed += p->kv_bytes_pushed();
    }
    for (int i = 0; i < cluster_->num_decode(); ++i) {
      auto d = cluster_->Status(cluster_->decode(i));
      EXPECT_TRUE(d.ok()) << d.status();
      if (d.ok()) n.d_tokens += d->prefill_tokens_computed();
    }
    return n;
  };
  const char* kWhere[] = {"prefill_worker", "decode_worker", "prefill_worker"};
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("router mode #", r));
    for (const auto& prompt : {c.prompt_ids, full}) {
      const Counters before = counters();
      v1::GenerateRequest only = IdsRequest(prompt, 0);
      only.set_prompt_logprobs(kTop);
      auto result = RunGenerate(cluster_->router(r), only, absl::Seconds(60));
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_TRUE(result->output_ids.empty());
      EXPECT_EQ(result->finish_reason, "length");
      EXPECT_EQ(result->usage.completion_tokens(), 0);
      EXPECT_EQ(result->timings.prefill_location(), kWhere[r]);
      EXPECT_EQ(result->timings.prefill_decision().reason(), "prompt_only");
      const std::vector<Scored> got = ScoresOf(*result);
      ASSERT_EQ(got.size(), prompt.size() - 1);
      if (prompt.size() == c.prompt_ids.size()) {
        EXPECT_EQ(got, want);
      }
      // The workers count a pass's tokens right after it: poll briefly.
      const int64_t n = static_cast<int64_t>(prompt.size());
      Counters after = counters();
      for (int tries = 0;
           tries < 100 && after.p_tokens + after.d_tokens <
                              before.p_tokens + before.d_tokens + n;
           ++tries) {
        absl::SleepFor(absl::Milliseconds(20));
        after = counters();
      }
      EXPECT_EQ(after.pushed, before.pushed);  // no KV moved
      EXPECT_EQ(after.p_tokens - before.p_tokens, r == 1 ? 0 : n);
      EXPECT_EQ(after.d_tokens - before.d_tokens, r == 1 ? n : 0);
    }
  }
  auto complete = CompleteJsonLine({{"prompt_ids", c.prompt_ids},
                                    {"max_tokens", 0},
                                    {"prompt_logprobs", kTop}},
                                   {});
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_TRUE((*complete)["output_ids"].empty()) << complete->dump();
  EXPECT_EQ((*complete)["prompt_logprobs"].size(), c.prompt_ids.size());
  // Without prompt_logprobs there is nothing to return: refused.
  auto refused = RunGenerate(cluster_->router(0), IdsRequest(c.prompt_ids, 0),
                             absl::Seconds(60));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  // `pdserve generate` prints a prompt-only request's score as its output:
  // the sum of the same scores, and the perplexity over them.
  double sum = 0;
  for (const Scored& t : want) sum += t.logprob;
  auto printed = RunPdserveCapture(
      {"generate", "--target=" + cluster_->router_process(0).address(),
       "--max_tokens=0", "--prompt_logprobs=0",
       "--prompt_ids=" + absl::StrJoin(c.prompt_ids, ",")},
      absl::Seconds(60));
  ASSERT_TRUE(printed.ok()) << printed.status();
  EXPECT_EQ(*printed,
            absl::StrFormat("prompt: %zu tokens scored, log-likelihood %.4f, "
                            "perplexity %.4f (--json lists each token's)\n",
                            want.size(), sum,
                            std::exp(-sum / static_cast<double>(want.size()))));
}

TEST_F(ExactnessTest, KvReallyMovesFromPrefillToDecode) {
  // Counters before, one disaggregated request, counters after.
  std::vector<pb::WorkerStatusResponse> p0, d0;
  for (int i = 0; i < 2; ++i) {
    p0.push_back(*cluster_->Status(cluster_->prefill(i)));
    d0.push_back(*cluster_->Status(cluster_->decode(i)));
  }
  const ReferenceCase& c = cases_[0];
  auto result = RunGenerate(cluster_->router(0), IdsRequest(c.prompt_ids, 8),
                            absl::Seconds(60));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->timings.prefill_location(), "prefill_worker");
  // stories260K: 5 layers x 2 (K, V) x 4 kv heads x 8 head_dim x 4 bytes (f32).
  const int64_t expected_bytes =
      int64_t{5} * 2 * 4 * 8 * 4 * static_cast<int64_t>(c.prompt_ids.size());
  int64_t pushed = 0, received = 0, p_tokens = 0, d_prefill = 0;
  // The push's ack is counted by P right after D verifies the commit: poll.
  for (int tries = 0; tries < 100; ++tries) {
    pushed = received = p_tokens = d_prefill = 0;
    for (int i = 0; i < 2; ++i) {
      auto p = *cluster_->Status(cluster_->prefill(i));
      auto d = *cluster_->Status(cluster_->decode(i));
      pushed += p.kv_bytes_pushed() - p0[i].kv_bytes_pushed();
      p_tokens += p.prefill_tokens_computed() - p0[i].prefill_tokens_computed();
      received += d.kv_bytes_received() - d0[i].kv_bytes_received();
      d_prefill +=
          d.prefill_tokens_computed() - d0[i].prefill_tokens_computed();
    }
    if (pushed == expected_bytes) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(pushed, expected_bytes);
  EXPECT_EQ(received, expected_bytes);
  EXPECT_EQ(p_tokens, static_cast<int64_t>(c.prompt_ids.size()));
  EXPECT_EQ(d_prefill, 0) << "the decode worker must not prefill";
  // Colocated: D prefills and nothing is pushed.
  auto colo = RunGenerate(cluster_->router(1), IdsRequest(c.prompt_ids, 8),
                          absl::Seconds(60));
  ASSERT_TRUE(colo.ok()) << colo.status();
  EXPECT_EQ(colo->timings.prefill_location(), "decode_worker");
  EXPECT_EQ(colo->output_ids, result->output_ids);
  ASSERT_TRUE(cluster_->WaitForNoKvInUse(absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace pdserve::testing
