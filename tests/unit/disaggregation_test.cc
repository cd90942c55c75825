// The --mode=auto disaggregation policy (a pure function of the workers'
// measurements) and the cost fit the workers measure with.
#include <cmath>

#include "common/util/cost_fit.h"
#include "gtest/gtest.h"
#include "router/disaggregation_policy.h"

namespace pdserve {
namespace {

// Workers as measured on a CPU: P and D alike, 20k prompt tokens/s with 1 ms
// per prefill; 64 KiB of KV per token over 8 layers at 1 GB/s; 2 ms hop.
DisaggregationInputs Measured(int prompt_tokens) {
  DisaggregationInputs in;
  in.prompt_tokens = prompt_tokens;
  in.prefill = PrefillCostInputs{20000, 0.001, 0};
  in.decode = PrefillCostInputs{20000, 0.001, 0};
  in.decode_running = 2;
  in.kv_receive_bytes_per_second = 1e9;
  in.kv_bytes_per_token = 64 << 10;
  in.num_layers = 8;
  in.handoff_seconds = 0.002;
  return in;
}

TEST(DisaggregationPolicyTest, ShortPromptPrefillsOnDecodeWorker) {
  const DisaggregationDecision d =
      DecidePrefillLocation(Measured(8), DisaggregationPolicyOptions{});
  EXPECT_TRUE(d.prefill_on_decode);
  EXPECT_EQ(d.reason, "estimate");
  ASSERT_TRUE(d.estimate_prefill_worker.has_value());
  ASSERT_TRUE(d.estimate_decode_worker.has_value());
  // P: 1 ms + 8/20000 + 2 ms hop + 8 * 8 KiB / 1 GB/s.
  EXPECT_NEAR(*d.estimate_prefill_worker,
              0.001 + 8.0 / 20000 + 0.002 + 8.0 * 8192 / 1e9, 1e-12);
  // D: 1 ms + 8/20000 + 2 running * 8/20000.
  EXPECT_NEAR(*d.estimate_decode_worker, 0.001 + 3 * 8.0 / 20000, 1e-12);
}

TEST(DisaggregationPolicyTest, LongPromptPrefillsOnPrefillWorker) {
  const DisaggregationDecision d =
      DecidePrefillLocation(Measured(2048), DisaggregationPolicyOptions{});
  EXPECT_FALSE(d.prefill_on_decode);
  EXPECT_EQ(d.reason, "estimate");
  EXPECT_LT(*d.estimate_prefill_worker, *d.estimate_decode_worker);
}

TEST(DisaggregationPolicyTest, IdleDecodeWorkerTakesLongPromptToo) {
  // Nothing to stall and no hop: the colocated path is faster.
  DisaggregationInputs in = Measured(2048);
  in.decode_running = 0;
  EXPECT_TRUE(DecidePrefillLocation(in, DisaggregationPolicyOptions{})
                  .prefill_on_decode);
}

TEST(DisaggregationPolicyTest, SaturatedPrefillPoolSendsToDecodeWorker) {
  DisaggregationInputs in = Measured(2048);
  in.prefill->queued_tokens = 400000;  // 20 s of queued prompts
  const DisaggregationDecision d =
      DecidePrefillLocation(in, DisaggregationPolicyOptions{});
  EXPECT_TRUE(d.prefill_on_decode);
  EXPECT_GT(*d.estimate_prefill_worker, 20.0);
}

TEST(DisaggregationPolicyTest, SlowKvTransferFavoursDecodeWorker) {
  DisaggregationInputs in = Measured(512);
  in.decode_running = 1;
  EXPECT_FALSE(DecidePrefillLocation(in, DisaggregationPolicyOptions{})
                   .prefill_on_decode);
  in.kv_receive_bytes_per_second = 1e6;  // 1 MB/s: 4 s for one layer's share
  EXPECT_TRUE(DecidePrefillLocation(in, DisaggregationPolicyOptions{})
                  .prefill_on_decode);
}

TEST(DisaggregationPolicyTest, NoMeasurementsUseThresholdRule) {
  DisaggregationPolicyOptions o;
  o.threshold_tokens = 32;
  DisaggregationInputs in;
  in.prefill = PrefillCostInputs{};  // healthy P, nothing measured yet
  in.decode = PrefillCostInputs{20000, 0.001, 0};
  in.prompt_tokens = 31;
  DisaggregationDecision d = DecidePrefillLocation(in, o);
  EXPECT_TRUE(d.prefill_on_decode);
  EXPECT_EQ(d.reason, "threshold");
  EXPECT_FALSE(d.estimate_prefill_worker.has_value());
  in.prompt_tokens = 32;
  d = DecidePrefillLocation(in, o);
  EXPECT_FALSE(d.prefill_on_decode);
  EXPECT_EQ(d.reason, "threshold");
  // D unmeasured: threshold rule as well.
  in = Measured(100);
  in.decode = PrefillCostInputs{};
  d = DecidePrefillLocation(in, o);
  EXPECT_EQ(d.reason, "threshold");
  EXPECT_FALSE(d.prefill_on_decode);
  // No healthy prefill worker: D.
  in.prefill.reset();
  EXPECT_TRUE(DecidePrefillLocation(in, o).prefill_on_decode);
}

TEST(CostFitTest, RecoversOverheadAndRate) {
  CostFit fit(0.2);
  EXPECT_EQ(fit.Get().rate, 0);
  // seconds = 0.002 + tokens / 10000, alternating sizes.
  for (int i = 0; i < 40; ++i) {
    const double n = (i % 2 == 0) ? 16 : 400;
    fit.Add(n, 0.002 + n / 10000);
  }
  const CostFit::Estimate e = fit.Get();
  EXPECT_NEAR(e.rate, 10000, 1e-6 * 10000);
  EXPECT_NEAR(e.overhead, 0.002, 1e-9);
}

TEST(CostFitTest, EqualSizesGiveMeanRate) {
  CostFit fit;
  fit.Add(100, 0.01);
  fit.Add(100, 0.03);
  const CostFit::Estimate e = fit.Get();
  EXPECT_EQ(e.overhead, 0);
  // Means: 100 tokens, 0.014 s (0.01 then 0.2 toward 0.03).
  EXPECT_NEAR(e.rate, 100 / 0.014, 1e-6);
  fit.Add(0, 1.0);  // ignored
  fit.Add(5, -1.0);
  EXPECT_NEAR(fit.Get().rate, 100 / 0.014, 1e-6);
}

TEST(EwmaTest, FirstSampleThenWeighted) {
  Ewma e(0.5);
  EXPECT_EQ(e.Get(), 0);
  e.Add(10);
  EXPECT_EQ(e.Get(), 10);
  e.Add(20);
  EXPECT_EQ(e.Get(), 15);
}

}  // namespace
}  // namespace pdserve
