// Sampling on hand-made logits: greedy ties, penalties, temperature, top-k,
// top-p, min-p (expected sets and frequencies computed from the definitions),
// logprobs, the Philox generator and stop rules.
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "common/sampling/sampler.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::vector<double> Softmax(const std::vector<double>& l) {
  double m = -INFINITY, z = 0;
  for (double v : l) m = std::max(m, v);
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp(l[i] - m);
  for (double& v : p) v /= z;
  return p;
}

// Frequencies of sampled ids over many positions.
std::map<int32_t, double> Frequencies(const std::vector<float>& logits,
                                      const SamplingParams& params, int n) {
  std::map<int32_t, double> f;
  for (int pos = 0; pos < n; ++pos) {
    f[SampleToken(logits, params, {}, {}, pos).id] += 1.0 / n;
  }
  return f;
}

TEST(Philox, KnownAnswerVector) {
  // Random123's published known-answer test for philox4x32_10.
  const uint32_t ctr[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
  const uint32_t key[2] = {0xa4093822, 0x299f31d0};
  uint32_t out[4];
  Philox4x32(ctr, key, out);
  EXPECT_EQ(out[0], 0xd16cfe09u);
  EXPECT_EQ(out[1], 0x94fdccebu);
  EXPECT_EQ(out[2], 0x5001e420u);
  EXPECT_EQ(out[3], 0x24126ea1u);
  const uint32_t zero[4] = {0, 0, 0, 0};
  const uint32_t zkey[2] = {0, 0};
  Philox4x32(zero, zkey, out);
  EXPECT_EQ(out[0], 0x6627e8d5u);
  EXPECT_EQ(out[1], 0xe169c58du);
  EXPECT_EQ(out[2], 0xbc57ac4cu);
  EXPECT_EQ(out[3], 0x9b00dbd8u);
}

TEST(Philox, UniformIsAFunctionOfSeedAndPosition) {
  EXPECT_EQ(UniformForPosition(42, 7), UniformForPosition(42, 7));
  EXPECT_NE(UniformForPosition(42, 7), UniformForPosition(42, 8));
  EXPECT_NE(UniformForPosition(42, 7), UniformForPosition(43, 7));
  double mean = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = UniformForPosition(1, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    mean += u / 10000;
  }
  EXPECT_NEAR(mean, 0.5, 0.02);
}

TEST(Sampler, GreedyTakesLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(SampleToken({1.0f, 3.0f, 3.0f, 2.0f}, p, {}, {}, 0).id, 1);
}

TEST(Sampler, LogprobsAreRawLogSoftmaxAndTopKSorted) {
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 3;
  p.repetition_penalty = 2.0f;  // changes the choice, not the logprobs
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  const std::vector<double> sm = Softmax({0.5, 2.0, -1.0, 2.0, 1.0});
  const std::vector<int32_t> prompt = {1};
  SampledToken t = SampleToken(logits, p, prompt, {}, 0);
  EXPECT_EQ(t.id, 3);  // 2.0 / 2 = 1.0 for id 1
  EXPECT_NEAR(t.logprob, std::log(sm[3]), 1e-6);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].first, 1);
  EXPECT_EQ(t.top_logprobs[1].first, 3);
  EXPECT_EQ(t.top_logprobs[2].first, 4);
  EXPECT_NEAR(t.top_logprobs[2].second, std::log(sm[4]), 1e-6);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 4.0f;
  // id 0: 3.0 -> 0.75 (seen); id 1: 1.0 (unseen) wins.
  EXPECT_EQ(SampleToken({3.0f, 1.0f, -0.1f}, p, {0}, {}, 0).id, 1);
  // Negative seen logits get more negative: id 1 -0.5 -> -2.0; id 2 -1 wins.
  EXPECT_EQ(SampleToken({-3.0f, -0.5f, -1.0f}, p, {}, {1}, 0).id, 2);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesUseOutputCounts) {
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.5f;
  // id 0 appears 3 times in the output: 2.0 - 1.5 = 0.5 < 1.0.
  EXPECT_EQ(SampleToken({2.0f, 1.0f}, p, {}, {0, 0, 0}, 0).id, 1);
  // Prompt occurrences do not count.
  EXPECT_EQ(SampleToken({2.0f, 1.0f}, p, {0, 0, 0}, {}, 0).id, 0);
  p.frequency_penalty = 0;
  p.presence_penalty = 1.5f;  // once is enough: 2.0 - 1.5 = 0.5
  EXPECT_EQ(SampleToken({2.0f, 1.0f}, p, {}, {0}, 0).id, 1);
}

// logit_bias adds to the logits after the penalties and before the
// temperature: greedy follows it, sampling draws from the biased softmax,
// -100 bans, ids outside the vocabulary are skipped, and the returned
// logprobs stay the raw ones.
TEST(Sampler, LogitBiasShiftsTheLogitsButNotTheLogprobs) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{1, 1.5f}};  // 1.0 + 1.5 = 2.5 > 2.0
  const SampledToken t = SampleToken(logits, p, {}, {}, 0);
  EXPECT_EQ(t.id, 1);
  const double raw = 1.0 - std::log(std::exp(2.0) + std::exp(1.0) + 1.0);
  EXPECT_NEAR(t.logprob, raw, 1e-6);
  // After the repetition penalty: 2.0 / 2 + 0.3 = 1.3 > 1.2 (before it,
  // (2.0 + 0.3) / 2 = 1.15 would lose).
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{0, 0.3f}};
  EXPECT_EQ(SampleToken({2.0f, 1.2f}, p, {0}, {}, 0).id, 0);
  p.repetition_penalty = 1.0f;
  // -100 bans the best token; an id outside the vocabulary is skipped.
  p.logit_bias = {{0, -100.0f}, {7, 100.0f}};
  EXPECT_EQ(SampleToken(logits, p, {}, {}, 0).id, 1);
  // Sampling: biased logits {2, 1, 0} + {0, 0, 2} = {2, 1, 2}, over T = 2.
  p.temperature = 2.0f;
  p.seed = 3;
  p.logit_bias = {{2, 2.0f}};
  const auto want = Softmax({1.0, 0.5, 1.0});
  auto f = Frequencies(logits, p, 20000);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(f[i], want[i], 0.015) << i;
  p.logit_bias = {{0, -100.0f}, {1, -100.0f}};
  f = Frequencies(logits, p, 2000);
  EXPECT_EQ(f.size(), 1u);
  EXPECT_EQ(f.begin()->first, 2);
}

// min_tokens: eos (unless ignore_eos) and stop ids are banned while the
// output is short of it; a banned id is never sampled, greedy or not, and
// keeps its raw logprob in the top list.
TEST(Sampler, MinTokensBansTheIdsThatWouldEndTheOutput) {
  StopParams stop;
  stop.eos_ids = {2};
  stop.stop_token_ids = {5};
  stop.min_tokens = 3;
  EXPECT_EQ(StopIdsBanned(stop, 0), (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(StopIdsBanned(stop, 2), (std::vector<int32_t>{2, 5}));
  EXPECT_TRUE(StopIdsBanned(stop, 3).empty());
  stop.ignore_eos = true;
  EXPECT_EQ(StopIdsBanned(stop, 0), (std::vector<int32_t>{5}));
  stop.min_tokens = 0;
  EXPECT_TRUE(StopIdsBanned(stop, 0).empty());

  const std::vector<float> logits = {0.0f, 0.5f, 4.0f, 1.0f, 0.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 1;
  const std::vector<int32_t> banned = {2, 5};
  const SampledToken greedy = SampleToken(logits, p, {}, {}, 0, banned);
  EXPECT_EQ(greedy.id, 3);
  ASSERT_EQ(greedy.top_logprobs.size(), 1u);
  EXPECT_EQ(greedy.top_logprobs[0].first, 2);  // raw logprobs
  p.temperature = 1.5f;
  p.seed = 9;
  for (int pos = 0; pos < 2000; ++pos) {
    const int32_t id = SampleToken(logits, p, {}, {}, pos, banned).id;
    ASSERT_NE(id, 2) << pos;
    ASSERT_NE(id, 5) << pos;
  }
}

TEST(Sampler, TemperatureSamplingFollowsSoftmax) {
  SamplingParams p;
  p.temperature = 2.0f;
  p.seed = 11;
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  const auto want = Softmax({0.0, 0.5, 1.0});
  auto f = Frequencies(logits, p, 20000);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(f[i], want[i], 0.015) << i;
}

TEST(Sampler, TopKTopPMinPKeepTheExpectedSets) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f, 2.5f};
  const auto sm = Softmax({1.0, 3.0, 2.0, 0.0, 2.5});
  SamplingParams p;
  p.seed = 5;
  p.temperature = 1.0f;
  p.top_k = 2;  // ids 1 and 4
  auto f = Frequencies(logits, p, 20000);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_NEAR(f[1], sm[1] / (sm[1] + sm[4]), 0.015);
  // top_p: sorted probs 1, 4, 2, 0, 3; keep the shortest prefix reaching p.
  p.top_k = 0;
  p.top_p = static_cast<float>(sm[1] + sm[4] + 0.5 * sm[2]);
  f = Frequencies(logits, p, 20000);
  EXPECT_EQ((std::set<int32_t>{1, 4, 2}),
            (std::set<int32_t>{f.begin()->first, std::next(f.begin())->first,
                               std::next(f.begin(), 2)->first}));
  EXPECT_EQ(f.size(), 3u);
  const double z = sm[1] + sm[4] + sm[2];
  EXPECT_NEAR(f[2], sm[2] / z, 0.015);
  // min_p: keep p >= min_p * p_max. ratio to max for id 2 = e^-1 ~ 0.37,
  // id 4 = e^-0.5 ~ 0.61: min_p 0.5 keeps {1, 4}.
  p.top_p = 1.0f;
  p.min_p = 0.5f;
  f = Frequencies(logits, p, 20000);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_GT(f[1], 0.0);
  EXPECT_GT(f[4], 0.0);
}

TEST(Sampler, SeededDrawIsReproducibleAndPositionKeyed) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 0.7f) * 2;
  SamplingParams p;
  p.seed = 1234;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  std::vector<int32_t> a, b;
  for (int pos = 0; pos < 200; ++pos) {
    a.push_back(SampleToken(logits, p, {}, {}, pos).id);
    b.push_back(SampleToken(logits, p, {}, {}, pos).id);
  }
  EXPECT_EQ(a, b);
  p.seed = 1235;
  std::vector<int32_t> c;
  for (int pos = 0; pos < 200; ++pos)
    c.push_back(SampleToken(logits, p, {}, {}, pos).id);
  EXPECT_NE(a, c);
}

TEST(Sampler, ValidateRejectsBadValues) {
  SamplingParams p;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  p.top_p = 0;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.temperature = -1;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.min_p = 1.5f;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.repetition_penalty = 0;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.logit_bias = {{3, -100.0f}, {4, 100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  for (float bad : {100.5f, -101.0f, std::nanf(""), INFINITY}) {
    p.logit_bias = {{3, bad}};
    EXPECT_FALSE(ValidateSamplingParams(p).ok()) << bad;
  }
}

// A scored token's rank is its place in the order of top_logprobs (larger
// logit first, ties by smaller id), 1 for the most likely.
TEST(Sampler, ScoreTokenRanksByTheTopLogprobsOrder) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f, -1.0f};
  const std::vector<int32_t> order = {1, 2, 3, 0, 4};
  for (size_t i = 0; i < order.size(); ++i) {
    const SampledToken scored = ScoreToken(logits, order[i], 5);
    EXPECT_EQ(scored.rank, static_cast<int32_t>(i + 1)) << order[i];
    ASSERT_EQ(scored.top_logprobs.size(), 5u);
    EXPECT_EQ(scored.top_logprobs[i].first, order[i]);
    EXPECT_EQ(scored.top_logprobs[i].second, scored.logprob);
  }
}

TEST(Stop, EosStopIdsMaxTokensAndIgnoreEos) {
  StopParams s;
  s.eos_ids = {2, 1};
  s.stop_token_ids = {7};
  s.max_tokens = 3;
  EXPECT_EQ(StopReason(s, 1, 1), "stop");
  EXPECT_EQ(StopReason(s, 2, 3), "stop");
  EXPECT_EQ(StopReason(s, 7, 1), "stop");
  EXPECT_EQ(StopReason(s, 5, 2), "");
  EXPECT_EQ(StopReason(s, 5, 3), "length");
  s.ignore_eos = true;
  EXPECT_EQ(StopReason(s, 1, 1), "");
  EXPECT_EQ(StopReason(s, 7, 1), "stop");
}

}  // namespace
}  // namespace pdserve
