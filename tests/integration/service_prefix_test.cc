// Prefix caching in the service: the router sends prompts sharing their first
// KV blocks to the same prefill worker, which reuses the cached blocks of the
// earlier prompt and computes only the remainder (asserted on the workers'
// counters), pushes the full KV, and the output is identical to an engine
// without prefix caching (`pdserve complete --prefix_caching=false`).
// Distinct prefixes spread over the prefill pool.
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 37 + salt * 101) % 500;
  return t;
}

v1::GenerateRequest Seeded(const std::vector<int32_t>& ids) {
  v1::GenerateRequest req = IdsRequest(ids, 24);
  req.mutable_sampling()->set_temperature(0.8f);
  req.mutable_sampling()->set_top_p(0.9f);
  req.mutable_sampling()->set_seed(11);
  req.set_ignore_eos(true);
  return req;
}

// The same request on a plain engine (no prefix cache).
std::vector<int32_t> Reference(const std::vector<int32_t>& ids) {
  auto out = CompleteOutputIds(
      ids, {"--prefix_caching=false", "--max_tokens=24", "--temperature=0.8",
            "--top_p=0.9", "--seed=11", "--ignore_eos"});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.value_or(std::vector<int32_t>());
}

struct Counters {
  std::vector<int64_t> computed, hits;
};

Counters Read(Cluster& c) {
  Counters k;
  for (int i = 0; i < c.num_prefill(); ++i) {
    auto s = c.Status(c.prefill(i));
    EXPECT_TRUE(s.ok()) << s.status();
    k.computed.push_back(s.ok() ? s->prefill_tokens_computed() : -1);
    k.hits.push_back(s.ok() ? s->prefix_hit_tokens() : -1);
  }
  return k;
}

TEST(PrefixCaching, SharedPrefixIsRoutedToItsWorkerAndComputesOnlyTheRest) {
  ClusterOptions o;
  o.prefill = 3;
  o.decode = 1;
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;

  const std::vector<int32_t> prefix = Tokens(64, 1);
  std::vector<int32_t> first = prefix, second = prefix;
  for (int32_t t : Tokens(5, 2)) first.push_back(t);
  for (int32_t t : Tokens(9, 3)) second.push_back(t);
  const std::vector<int32_t> other = Tokens(70, 4);  // another prefix

  auto run = [&](const std::vector<int32_t>& ids, int* worker,
                 int64_t* computed, int64_t* hits) {
    const Counters before = Read(c);
    auto result = RunGenerate(c.router(), Seeded(ids), absl::Seconds(60));
    EXPECT_TRUE(result.ok()) << result.status() << c.Logs();
    const Counters after = Read(c);
    *computed = *hits = 0;
    *worker = -1;
    for (int i = 0; i < c.num_prefill(); ++i) {
      const int64_t dc = after.computed[i] - before.computed[i];
      const int64_t dh = after.hits[i] - before.hits[i];
      if (dc + dh > 0) {
        EXPECT_EQ(*worker, -1) << "two prefill workers ran one prompt";
        *worker = i;
      }
      *computed += dc;
      *hits += dh;
    }
    return result.ok() ? result->output_ids : std::vector<int32_t>{};
  };

  int w1 = -1, w2 = -1, w3 = -1;
  int64_t computed = 0, hits = 0;
  const auto out1 = run(first, &w1, &computed, &hits);
  EXPECT_EQ(computed, 69);
  EXPECT_EQ(hits, 0);
  const auto out2 = run(second, &w2, &computed, &hits);
  EXPECT_EQ(w2, w1) << "the shared prefix must be routed to its worker";
  EXPECT_EQ(hits, 64);
  EXPECT_EQ(computed, 9) << "only the remainder is computed";
  const auto out3 = run(other, &w3, &computed, &hits);
  EXPECT_EQ(hits, 0);
  EXPECT_EQ(computed, 70);
  // Exact: identical to an engine that computes everything.
  EXPECT_EQ(out1, Reference(first));
  EXPECT_EQ(out2, Reference(second));
  EXPECT_EQ(out3, Reference(other));
  EXPECT_EQ(out2.size(), 24u);
  // Repeating the second prompt: everything but its last partial block and
  // at least one token is reused.
  int w4 = -1;
  const auto out4 = run(second, &w4, &computed, &hits);
  EXPECT_EQ(w4, w1);
  EXPECT_EQ(hits, 64);
  EXPECT_EQ(computed, 9);
  EXPECT_EQ(out4, out2);
  // Many prefixes: each sticks to its own worker (a repeat with another
  // suffix hits there) and, by rendezvous hashing, they spread over the
  // pool, where least-loaded routing of idle workers would pick one.
  std::set<int> used;
  for (int k = 0; k < 10; ++k) {
    std::vector<int32_t> a = Tokens(48, 10 + k), b = a;
    a.push_back(5);
    b.push_back(6);
    b.push_back(7);
    int wa = -1, wb = -1;
    run(a, &wa, &computed, &hits);
    EXPECT_EQ(hits, 0);
    run(b, &wb, &computed, &hits);
    EXPECT_EQ(wb, wa) << "prefix " << k;
    EXPECT_EQ(hits, 48) << "prefix " << k;
    EXPECT_EQ(computed, 2) << "prefix " << k;
    used.insert(wa);
  }
  EXPECT_GT(used.size(), 1u) << "prefixes did not spread over the pool";
  // Cached blocks are free, not in use.
  ASSERT_TRUE(c.WaitForNoKvInUse(absl::Seconds(10)).ok()) << c.Logs();
  auto status = c.Status(c.prefill(w1));
  ASSERT_TRUE(status.ok());
  EXPECT_GE(status->prefix_cached_blocks(), 4);
}

}  // namespace
}  // namespace pdserve::testing
