// --mode=auto with measurements (issue 5): once the workers have measured
// their prefill cost, a short prompt on an idle cluster is prefilled on the
// decode worker, a long one while the decode worker runs a batch on the
// prefill worker; both outputs exact. `pdserve generate --json` shows the
// decision.
#include <atomic>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

// A prompt of n tokens (BOS + a pattern salted so prompts differ and miss
// the prefix caches).
std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t = {1};
  for (int i = 1; i < n; ++i) t.push_back(3 + (i * 53 + salt * 97) % 500);
  return t;
}

std::vector<int32_t> Complete(const std::vector<int32_t>& ids, int max_tokens) {
  auto out = CompleteOutputIds(
      ids, {absl::StrCat("--max_tokens=", max_tokens), "--temperature=0"});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.value_or(std::vector<int32_t>());
}

TEST(AutoModeTest, ShortPromptOnDecodeWorkerLongOnPrefillWorker) {
  const std::vector<int32_t> long_prompt = Tokens(460, 1000);
  const std::vector<int32_t> long_expected = Complete(long_prompt, 16);
  ASSERT_EQ(long_expected.size(), 16u);
  const ReferenceCase ref = LoadReferenceCases()[0];

  ClusterOptions o;
  o.prefill = 1;
  o.decode = 1;
  o.modes = {"auto", "colocated", "disaggregated"};
  o.router_flags = {"--worker_poll_ms=50", "--auto_prefill_threshold=32"};
  // Slow streams keep the background requests in flight on D.
  o.decode_flags = {"--testonly_stream_delay_ms=20"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  v1::Generation::Stub& auto_router = c.router(0);
  v1::Generation::Stub& colocated_router = c.router(1);
  v1::Generation::Stub& disaggregated_router = c.router(2);

  // Before any measurement: the threshold rule.
  {
    auto r = RunGenerate(auto_router, IdsRequest(Tokens(100, 1), 2),
                         absl::Seconds(60));
    ASSERT_TRUE(r.ok()) << r.status() << c.Logs();
    EXPECT_EQ(r->timings.prefill_decision().reason(), "threshold");
    EXPECT_EQ(r->timings.prefill_location(), "prefill_worker");
  }
  // Warm-up: D measures colocated prefills of several sizes, P the same
  // sizes through the disaggregated router, interleaved so that both fits
  // see the same machine load. (Through the auto router P's prefills would
  // stop once D is measured, leaving P's fit to its first, cold pass: a CI
  // run once measured P 4x slower per token than D that way.)
  int salt = 2;
  for (int round = 0; round < 2; ++round) {
    for (int n : {8, 24, 100, 250}) {
      for (v1::Generation::Stub* router :
           {&colocated_router, &disaggregated_router}) {
        auto r = RunGenerate(*router, IdsRequest(Tokens(n, salt++), 2),
                             absl::Seconds(60));
        ASSERT_TRUE(r.ok()) << r.status();
      }
    }
  }
  // Both report a measured throughput and the router has polled it.
  for (int i = 0; i < 100; ++i) {
    auto p = c.Status(c.prefill(0));
    auto d = c.Status(c.decode(0));
    ASSERT_TRUE(p.ok() && d.ok());
    if (p->prefill_tokens_per_second() > 0 &&
        d->prefill_tokens_per_second() > 0) {
      EXPECT_GT(d->kv_receive_bytes_per_second(), 0);
      EXPECT_GT(d->kv_bytes_per_token(), 0);
      std::printf(
          "measured prefill: P %.0f tok/s + %.6f s, D %.0f tok/s + %.6f s\n",
          p->prefill_tokens_per_second(), p->prefill_overhead_seconds(),
          d->prefill_tokens_per_second(), d->prefill_overhead_seconds());
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  absl::SleepFor(absl::Milliseconds(300));  // a few status polls

  // Idle cluster, short prompt: prefilled on D.
  {
    auto r = RunGenerate(auto_router, IdsRequest(ref.prompt_ids, 16),
                         absl::Seconds(60));
    ASSERT_TRUE(r.ok()) << r.status();
    const auto& d = r->timings.prefill_decision();
    EXPECT_EQ(d.reason(), "estimate");
    EXPECT_TRUE(d.has_estimate_prefill_worker());
    EXPECT_TRUE(d.has_estimate_decode_worker());
    std::printf("short prompt: P %.6f s, D %.6f s -> %s\n",
                d.estimate_prefill_worker(), d.estimate_decode_worker(),
                r->timings.prefill_location().c_str());
    EXPECT_EQ(r->timings.prefill_location(), "decode_worker")
        << "estimates: P " << d.estimate_prefill_worker() << " s, D "
        << d.estimate_decode_worker() << " s";
    EXPECT_EQ(r->output_ids, std::vector<int32_t>(ref.output_ids.begin(),
                                                  ref.output_ids.begin() + 16));
  }

  // D runs a batch (8 streams in flight through the auto router): the long
  // prompt would stall it, so it is prefilled on P. (With 8 running, D's
  // estimate is 9x its compute of the prompt, which leaves P's estimate,
  // dominated by the measured handoff, a wide margin on a loaded machine.)
  constexpr int kBackground = 8;
  std::vector<std::atomic<int>> seen(kBackground);
  std::vector<std::thread> background;
  for (int i = 0; i < kBackground; ++i) {
    background.emplace_back([&, i] {
      auto r = RunGenerate(
          auto_router, IdsRequest(ref.prompt_ids, 40), absl::Seconds(60),
          [&seen, i](const std::string&) { seen[i].fetch_add(1); });
      EXPECT_TRUE(r.ok()) << r.status();
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int i = 0; i < kBackground; ++i) {
    while (seen[i].load() < 1 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  {
    auto r = RunGenerate(auto_router, IdsRequest(long_prompt, 16),
                         absl::Seconds(60));
    ASSERT_TRUE(r.ok()) << r.status();
    const auto& d = r->timings.prefill_decision();
    EXPECT_EQ(d.reason(), "estimate");
    std::printf("long prompt, D busy: P %.6f s, D %.6f s -> %s\n",
                d.estimate_prefill_worker(), d.estimate_decode_worker(),
                r->timings.prefill_location().c_str());
    EXPECT_EQ(r->timings.prefill_location(), "prefill_worker")
        << "estimates: P " << d.estimate_prefill_worker() << " s, D "
        << d.estimate_decode_worker() << " s";
    EXPECT_EQ(r->output_ids, long_expected);
  }
  for (auto& t : background) t.join();

  // The client shows the decision.
  auto json = RunPdserveCapture(
      {"generate", "--json", "--target=" + c.router_process(0).address(),
       "--max_tokens=4", "--temperature=0",
       "--prompt_ids=" + absl::StrJoin(ref.prompt_ids, ",")},
      absl::Seconds(60));
  ASSERT_TRUE(json.ok()) << json.status();
  auto j = nlohmann::json::parse(*json);
  EXPECT_EQ(j.at("timings").at("prefill_decision").at("reason"), "estimate");
  EXPECT_TRUE(j.at("timings").contains("prefill_location"));
  absl::Status s = c.WaitForNoKvInUse(absl::Seconds(15));
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace pdserve::testing
