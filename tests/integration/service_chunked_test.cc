// Chunked prefill in the service: with --prefill_chunk_tokens of 1, 16 and
// 100 on every worker, the prefill worker (disaggregated) and the decode
// worker (colocated) compute long prompts a chunk per forward pass while
// other prompts join the following passes, and every output is identical to
// an unchunked engine (`pdserve complete --prefill_chunk_tokens=0`) and to
// the bundled reference. Afterwards no KV block is in use anywhere.
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics/prometheus_text.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t = {1};  // BOS
  for (int i = 1; i < n; ++i) t.push_back(3 + (i * 53 + salt * 97) % 500);
  return t;
}

// A seeded request, so that every sampled token depends on exact logits.
v1::GenerateRequest Seeded(const std::vector<int32_t>& ids) {
  v1::GenerateRequest req = IdsRequest(ids, 20);
  req.mutable_sampling()->set_temperature(0.9f);
  req.mutable_sampling()->set_seed(5);
  req.set_ignore_eos(true);
  return req;
}

// The same request on an unchunked engine.
std::vector<int32_t> Unchunked(const std::vector<int32_t>& ids) {
  auto out =
      CompleteOutputIds(ids, {"--prefill_chunk_tokens=0",
                              "--prefix_caching=false", "--max_tokens=20",
                              "--temperature=0.9", "--seed=5", "--ignore_eos"});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.value_or(std::vector<int32_t>());
}

class ChunkedPrefill : public ::testing::TestWithParam<int> {};

TEST_P(ChunkedPrefill, OutputsEqualUnchunkedInEveryMode) {
  const int chunk = GetParam();
  // Long prompts of several sizes (the 300-token one spans many chunks).
  const std::vector<std::vector<int32_t>> long_prompts = {
      Tokens(300, 1), Tokens(117, 2), Tokens(64, 3)};
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : long_prompts) expected.push_back(Unchunked(p));

  ClusterOptions o;
  o.prefill = 1;
  o.decode = 1;
  o.modes = {"disaggregated", "colocated"};
  o.common_flags = {absl::StrCat("--prefill_chunk_tokens=", chunk),
                    "--prefix_caching=false", "--metrics_port=-1"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const auto cases = LoadReferenceCases();
  ASSERT_FALSE(cases.empty());

  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r == 0 ? "disaggregated" : "colocated");
    // All at once: the short reference prompts arrive while the long ones
    // are being prefilled chunk by chunk.
    std::vector<std::thread> threads;
    std::vector<absl::StatusOr<GenerateResult>> long_out(
        long_prompts.size(), absl::UnknownError("not run"));
    std::vector<absl::StatusOr<GenerateResult>> ref_out(
        cases.size(), absl::UnknownError("not run"));
    for (size_t i = 0; i < long_prompts.size(); ++i) {
      threads.emplace_back([&, i] {
        long_out[i] = RunGenerate(c.router(r), Seeded(long_prompts[i]),
                                  absl::Seconds(60));
      });
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      threads.emplace_back([&, i] {
        ref_out[i] = RunGenerate(
            c.router(r),
            IdsRequest(cases[i].prompt_ids, cases[i].max_new_tokens),
            absl::Seconds(60));
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < long_prompts.size(); ++i) {
      ASSERT_TRUE(long_out[i].ok()) << long_out[i].status() << c.Logs();
      EXPECT_EQ(long_out[i]->output_ids, expected[i])
          << "long prompt " << i << " at chunk " << chunk;
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      ASSERT_TRUE(ref_out[i].ok()) << ref_out[i].status() << c.Logs();
      EXPECT_EQ(ref_out[i]->output_ids, cases[i].output_ids)
          << "reference case " << i << " at chunk " << chunk;
    }
  }
  // The prefill worker really computed the prompts (no cache hits).
  auto p = c.Status(c.prefill(0));
  ASSERT_TRUE(p.ok()) << p.status();
  int64_t prompt_tokens = 0;
  for (const auto& lp : long_prompts) prompt_tokens += lp.size();
  for (const auto& rc : cases) prompt_tokens += rc.prompt_ids.size();
  EXPECT_EQ(p->prefill_tokens_computed(), prompt_tokens);
  EXPECT_EQ(p->prefix_hit_tokens(), 0);
  // ... a chunk per pass: the 300-token prompt alone needs 300/chunk passes
  // (the other prompts share passes with it or run in their own).
  auto samples = metrics::ScrapeMetrics("127.0.0.1", c.prefill(0).metrics_port);
  ASSERT_TRUE(samples.ok()) << samples.status();
  const double passes =
      samples->Get("pdserve_prefill_batch_tokens_count").value_or(0);
  const double seqs =
      samples->Get("pdserve_prefill_batch_size_sum").value_or(0);
  EXPECT_GE(passes, (300 + chunk - 1) / chunk);
  std::printf("chunk %d: %.0f prefill passes, %.2f prompts per pass\n", chunk,
              passes, passes > 0 ? seqs / passes : 0.0);
  ASSERT_TRUE(c.WaitForNoKvInUse(absl::Seconds(20)).ok()) << c.Logs();
}

INSTANTIATE_TEST_SUITE_P(ChunkSizes, ChunkedPrefill,
                         ::testing::Values(1, 16, 100), [](const auto& info) {
                           return absl::StrCat("Chunk", info.param);
                         });

}  // namespace
}  // namespace pdserve::testing
