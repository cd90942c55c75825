// Tests of the load generator's pure parts: the latency arithmetic on fake
// streams with known timings, percentiles, goodput, datasets, arrivals, the
// JSON round trip and the SVG output.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/loadgen/arrival.h"
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/report.h"
#include "tools/loadgen/stats.h"
#include "tools/loadgen/svg_plot.h"

namespace pdserve::loadgen {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kUnavailable = 14;  // gRPC / absl UNAVAILABLE

// A fake response stream: sent at `sent`, one message per entry of
// `messages` ({time, tokens}), ended at `end` with `code`.
RequestRecord FakeStream(int index, double sent,
                         std::vector<std::pair<double, int>> messages,
                         double end, int code = 0, int prompt_tokens = 10) {
  StreamRecorder rec(index, sent, prompt_tokens, /*is_long=*/false);
  rec.OnSent(sent);
  for (const auto& [t, n] : messages) rec.OnMessage(t, n);
  return rec.Finish(end, code, code == 0 ? "" : "worker gone");
}

TEST(LoadgenStats, PercentileIsNumpyLinear) {
  // numpy.percentile([1, 2, 3, 4], [50, 90, 99]) = [2.5, 3.7, 3.97].
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_NEAR(Percentile({4, 1, 3, 2}, 90), 3.7, 1e-12);
  EXPECT_NEAR(Percentile({4, 1, 3, 2}, 99), 3.97, 1e-12);
  // numpy.percentile([15, 20, 35, 40, 50], 40) = 29.
  EXPECT_NEAR(Percentile({15, 20, 35, 40, 50}, 40), 29.0, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile({15, 20, 35, 40, 50}, 0), 15.0);
  EXPECT_DOUBLE_EQ(Percentile({15, 20, 35, 40, 50}, 100), 50.0);
  EXPECT_DOUBLE_EQ(Percentile({7.0}, 99), 7.0);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0.0);
}

TEST(LoadgenStats, FakeStreamLatencies) {
  // Sent at 1.0 s; tokens at 1.10, 1.15, 1.25 and 1.30 s; ends at 1.30 s.
  const RequestRecord r =
      FakeStream(0, 1.0, {{1.10, 1}, {1.15, 1}, {1.25, 1}, {1.30, 1}}, 1.30);
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_NEAR(*r.TtftMs(), 100.0, 1e-9);
  EXPECT_NEAR(*r.E2eMs(), 300.0, 1e-9);
  // (E2E - TTFT) / (tokens - 1) = 200 / 3.
  EXPECT_NEAR(*r.TpotMs(), 200.0 / 3.0, 1e-9);
  EXPECT_THAT(r.ItlMs(),
              ElementsAre(DoubleNear(50, 1e-9), DoubleNear(100, 1e-9),
                          DoubleNear(50, 1e-9)));
}

TEST(LoadgenStats, MultiTokenMessageIsOneGapAndCountsAllTokens) {
  // A message carrying 3 tokens: 5 tokens in 3 messages, 2 gaps.
  const RequestRecord r =
      FakeStream(0, 0.0, {{0.2, 1}, {0.5, 3}, {0.6, 1}}, 0.6);
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_EQ(r.ItlMs().size(), 2u);
  EXPECT_NEAR(*r.TpotMs(), (600.0 - 200.0) / 4.0, 1e-9);
}

TEST(LoadgenStats, OneTokenOutputHasNoTpotAndIsExcluded) {
  const RequestRecord one = FakeStream(0, 0.0, {{0.5, 1}}, 0.5);
  EXPECT_FALSE(one.TpotMs().has_value());
  EXPECT_TRUE(one.ItlMs().empty());
  const RequestRecord two = FakeStream(1, 0.0, {{0.1, 1}, {0.3, 1}}, 0.3);
  const BenchMetrics m = ComputeMetrics({one, two}, 1.0, SloSpec{});
  EXPECT_EQ(m.tpot_ms.count, 1);  // only `two`
  EXPECT_NEAR(m.tpot_ms.mean, 200.0, 1e-9);
  EXPECT_EQ(m.ttft_ms.count, 2);
  // A TPOT SLO does not fail a request that has no TPOT.
  SloSpec slo;
  slo.tpot_ms = 1.0;
  EXPECT_TRUE(MeetsSlo(one, slo));
  EXPECT_FALSE(MeetsSlo(two, slo));
}

TEST(LoadgenStats, GoodputThroughputAndErrors) {
  std::vector<RequestRecord> recs;
  // TTFT 100 ms, TPOT 50 ms, E2E 200 ms: meets every SLO below.
  recs.push_back(FakeStream(0, 0.0, {{0.1, 1}, {0.15, 1}, {0.2, 1}}, 0.2));
  // TTFT 300 ms: violates the TTFT SLO.
  recs.push_back(FakeStream(1, 0.5, {{0.8, 1}, {0.85, 1}, {0.9, 1}}, 0.9));
  // TPOT (1.2 - 0.1) / 2 = 550 ms: violates the TPOT SLO.
  recs.push_back(FakeStream(2, 1.0, {{1.1, 1}, {1.2, 1}, {2.1, 1}}, 2.1));
  // Failed after one token.
  recs.push_back(FakeStream(3, 1.5, {{1.6, 1}}, 1.7, kUnavailable));
  SloSpec slo;
  slo.ttft_ms = 150;
  slo.tpot_ms = 100;
  slo.e2e_ms = 5000;
  const double duration = RunDuration(recs);
  EXPECT_NEAR(duration, 2.1, 1e-12);
  const BenchMetrics m = ComputeMetrics(recs, duration, slo);
  EXPECT_EQ(m.num_requests, 4);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.good_requests, 1);
  EXPECT_NEAR(m.goodput, 1 / 2.1, 1e-12);
  EXPECT_NEAR(m.slo_attainment, 0.25, 1e-12);
  EXPECT_NEAR(m.request_throughput, 3 / 2.1, 1e-12);
  EXPECT_EQ(m.total_input_tokens, 30);
  EXPECT_EQ(m.total_output_tokens, 9);  // completed requests only
  EXPECT_NEAR(m.output_throughput, 9 / 2.1, 1e-12);
  EXPECT_EQ(m.errors_by_code.size(), 1u);
  EXPECT_EQ(m.errors_by_code.at("UNAVAILABLE"), 1);
  // TTFTs of completed requests: 100, 300, 100.
  EXPECT_NEAR(m.ttft_ms.mean, 500.0 / 3, 1e-9);
  EXPECT_NEAR(m.ttft_ms.median, 100.0, 1e-9);
  EXPECT_NEAR(m.ttft_ms.p90, Percentile({100, 300, 100}, 90), 1e-9);
  EXPECT_NEAR(m.ttft_ms.p90, 260.0, 1e-9);  // rank 1.8: 100 + 0.8 * 200
  // With an E2E SLO of 250 ms only request 0 passes as well; without any SLO
  // every completed request is good.
  const BenchMetrics none = ComputeMetrics(recs, duration, SloSpec{});
  EXPECT_EQ(none.good_requests, 3);
  EXPECT_NEAR(none.goodput, none.request_throughput, 1e-12);
}

TEST(LoadgenStats, UsageReplacesPromptLengthAndStagesAggregate) {
  StreamRecorder rec(7, 0.0, /*dataset_input_tokens=*/0, /*is_long=*/true);
  rec.OnSent(0.25);
  rec.OnMessage(0.5, 1);
  rec.OnMessage(0.75, 0);  // final message without tokens
  rec.OnUsage(42, 1);
  rec.OnStage("prefill_compute", 0.125);
  rec.OnFinishReason("length");
  const RequestRecord r = rec.Finish(0.75, 0, "");
  EXPECT_EQ(rec.usage_completion_tokens(), 1);
  EXPECT_EQ(r.index, 7);
  EXPECT_EQ(r.input_tokens, 42);
  EXPECT_EQ(r.output_tokens, 1);
  EXPECT_EQ(r.chunks.size(), 1u);
  EXPECT_TRUE(r.is_long);
  EXPECT_EQ(r.finish_reason, "length");
  const BenchMetrics m = ComputeMetrics({r}, 1.0, SloSpec{});
  EXPECT_NEAR(m.stage_ms.at("prefill_compute").mean, 125.0, 1e-9);
}

TEST(LoadgenStats, MixedClassesSplitShortAndLong) {
  std::vector<RequestRecord> recs;
  recs.push_back(FakeStream(0, 0.0, {{0.1, 1}, {0.2, 1}}, 0.2));  // TPOT 100
  recs.push_back(FakeStream(1, 0.0, {{0.1, 1}, {0.4, 1}}, 0.4));  // TPOT 300
  recs.push_back(FakeStream(2, 0.0, {{2.0, 1}, {2.05, 1}}, 2.05));
  recs[2].is_long = true;
  const BenchMetrics m = ComputeMetrics(recs, 2.05, SloSpec{});
  ASSERT_EQ(m.by_class.size(), 2u);
  EXPECT_EQ(m.by_class.at("short").completed, 2);
  EXPECT_NEAR(m.by_class.at("short").tpot_ms.median, 200.0, 1e-9);
  EXPECT_NEAR(m.by_class.at("short").ttft_ms.p99, 100.0, 1e-9);
  EXPECT_EQ(m.by_class.at("long").completed, 1);
  EXPECT_NEAR(m.by_class.at("long").ttft_ms.median, 2000.0, 1e-9);
  // Without long prompts there is no split.
  recs.pop_back();
  EXPECT_TRUE(ComputeMetrics(recs, 1.0, SloSpec{}).by_class.empty());
}

TEST(LoadgenStats, PeakGoodput) {
  std::vector<SweepPoint> pts(4);
  const double rates[] = {1, 2, 4, 8};
  const double goodputs[] = {1.0, 1.9, 2.5, 1.2};
  for (int i = 0; i < 4; ++i) {
    pts[i].request_rate = rates[i];
    pts[i].metrics.goodput = goodputs[i];
  }
  EXPECT_EQ(PeakGoodputIndex(pts), 2);
  EXPECT_THAT(FormatSweep(pts, SloSpec{}),
              HasSubstr("at request rate 4 req/s"));
  EXPECT_EQ(PeakGoodputIndex({}), -1);
  for (SweepPoint& p : pts) p.metrics.goodput = 0;
  EXPECT_THAT(FormatSweep(pts, SloSpec{}),
              HasSubstr("No request met the SLO at any rate"));
}

TEST(LoadgenArrival, InfiniteRateSendsAllAtOnce) {
  const std::vector<double> t =
      ArrivalOffsets(5, std::numeric_limits<double>::infinity(), 1.0, 0);
  EXPECT_THAT(t, ElementsAre(0, 0, 0, 0, 0));
  EXPECT_TRUE(std::isinf(*ParseRequestRate("inf")));
  EXPECT_DOUBLE_EQ(*ParseRequestRate("2.5"), 2.5);
  EXPECT_FALSE(ParseRequestRate("0").ok());
  EXPECT_FALSE(ParseRequestRate("fast").ok());
}

// Mean and squared coefficient of variation of the inter-arrival gaps.
void GapStats(const std::vector<double>& t, double* mean, double* cv2) {
  std::vector<double> gaps;
  for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
  *mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
  double var = 0;
  for (double g : gaps) var += (g - *mean) * (g - *mean);
  var /= gaps.size();
  *cv2 = var / (*mean * *mean);
}

TEST(LoadgenArrival, PoissonAndGammaGaps) {
  double mean = 0, cv2 = 0;
  const std::vector<double> poisson = ArrivalOffsets(50000, 10.0, 1.0, 3);
  EXPECT_EQ(poisson.front(), 0.0);
  EXPECT_TRUE(std::is_sorted(poisson.begin(), poisson.end()));
  GapStats(poisson, &mean, &cv2);
  EXPECT_NEAR(mean, 0.1, 0.003);
  EXPECT_NEAR(cv2, 1.0, 0.05);  // exponential gaps: CV^2 = 1
  // Gamma with shape k: same mean, CV^2 = 1/k.
  GapStats(ArrivalOffsets(50000, 10.0, 0.25, 3), &mean, &cv2);
  EXPECT_NEAR(mean, 0.1, 0.005);
  EXPECT_NEAR(cv2, 4.0, 0.3);
  GapStats(ArrivalOffsets(50000, 10.0, 4.0, 3), &mean, &cv2);
  EXPECT_NEAR(cv2, 0.25, 0.02);
  // Deterministic per seed.
  EXPECT_EQ(ArrivalOffsets(100, 3.0, 1.0, 9), ArrivalOffsets(100, 3.0, 1.0, 9));
  EXPECT_NE(ArrivalOffsets(100, 3.0, 1.0, 9),
            ArrivalOffsets(100, 3.0, 1.0, 10));
}

DatasetOptions BaseOptions(DatasetKind kind) {
  DatasetOptions o;
  o.kind = kind;
  o.num_prompts = 400;
  o.input_len = 50;
  o.output_len = 20;
  o.token_lo = 100;
  o.token_hi = 480;
  o.seed = 1;
  return o;
}

void ExpectIdsInRange(const std::vector<BenchRequest>& reqs, int lo, int hi) {
  for (const BenchRequest& r : reqs) {
    ASSERT_EQ(r.input_tokens, static_cast<int>(r.prompt_ids.size()));
    for (int32_t id : r.prompt_ids) {
      ASSERT_GE(id, lo);
      ASSERT_LT(id, hi);
    }
  }
}

TEST(LoadgenDataset, FixedAndRandomLengths) {
  auto fixed = BuildDataset(BaseOptions(DatasetKind::kFixed));
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  ASSERT_EQ(fixed->size(), 400u);
  for (const BenchRequest& r : *fixed) {
    EXPECT_EQ(r.prompt_ids.size(), 50u);
    EXPECT_EQ(r.max_tokens, 20);
  }
  ExpectIdsInRange(*fixed, 100, 480);
  DatasetOptions o = BaseOptions(DatasetKind::kRandom);
  o.range_ratio = 0.5;
  auto random = BuildDataset(o);
  ASSERT_TRUE(random.ok()) << random.status();
  std::set<size_t> lengths;
  for (const BenchRequest& r : *random) {
    EXPECT_GE(r.prompt_ids.size(), 25u);
    EXPECT_LE(r.prompt_ids.size(), 75u);
    EXPECT_GE(r.max_tokens, 10);
    EXPECT_LE(r.max_tokens, 30);
    lengths.insert(r.prompt_ids.size());
  }
  EXPECT_GT(lengths.size(), 20u);  // lengths really vary
  ExpectIdsInRange(*random, 100, 480);
  // Deterministic per seed.
  auto again = BuildDataset(o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[17].prompt_ids, (*random)[17].prompt_ids);
  o.range_ratio = 1.0;
  EXPECT_FALSE(BuildDataset(o).ok());
}

TEST(LoadgenDataset, PrefixSharesPrefixes) {
  DatasetOptions o = BaseOptions(DatasetKind::kPrefix);
  o.prefix_len = 30;
  o.num_prefixes = 3;
  auto reqs = BuildDataset(o);
  ASSERT_TRUE(reqs.ok()) << reqs.status();
  std::set<std::vector<int32_t>> prefixes;
  for (size_t i = 0; i < reqs->size(); ++i) {
    const auto& ids = (*reqs)[i].prompt_ids;
    ASSERT_EQ(ids.size(), 80u);
    prefixes.insert(std::vector<int32_t>(ids.begin(), ids.begin() + 30));
    // Request i shares its prefix with request i + 3.
    if (i + 3 < reqs->size()) {
      EXPECT_TRUE(std::equal(ids.begin(), ids.begin() + 30,
                             (*reqs)[i + 3].prompt_ids.begin()));
    }
  }
  EXPECT_EQ(prefixes.size(), 3u);
}

TEST(LoadgenDataset, MixedLongFraction) {
  DatasetOptions o = BaseOptions(DatasetKind::kMixed);
  o.num_prompts = 2000;
  o.long_fraction = 0.2;
  o.long_input_len = 300;
  auto reqs = BuildDataset(o);
  ASSERT_TRUE(reqs.ok()) << reqs.status();
  int longs = 0;
  for (const BenchRequest& r : *reqs) {
    EXPECT_EQ(r.prompt_ids.size(), r.is_long ? 300u : 50u);
    longs += r.is_long;
  }
  EXPECT_NEAR(longs / 2000.0, 0.2, 0.03);
}

TEST(LoadgenDataset, JsonlFile) {
  auto reqs = ParseDatasetJsonl(
      "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8}\n\n"
      "{\"prompt_ids\": [1, 2, 3]}\n",
      16);
  ASSERT_TRUE(reqs.ok()) << reqs.status();
  ASSERT_EQ(reqs->size(), 2u);
  EXPECT_EQ((*reqs)[0].prompt_text, "Once upon a time");
  EXPECT_EQ((*reqs)[0].max_tokens, 8);
  EXPECT_EQ((*reqs)[0].input_tokens, 0);
  EXPECT_THAT((*reqs)[1].prompt_ids, ElementsAre(1, 2, 3));
  EXPECT_EQ((*reqs)[1].max_tokens, 16);
  EXPECT_EQ((*reqs)[1].input_tokens, 3);

  auto bad = ParseDatasetJsonl("{\"prompt\": \"a\"}\n{\"prompt\": 3}\n", 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 2"));
  EXPECT_FALSE(ParseDatasetJsonl("{\"text\": \"a\"}\n", 4).ok());
  EXPECT_FALSE(ParseDatasetJsonl("not json\n", 4).ok());

  // A file is cycled up to num_prompts.
  const std::string path = ::testing::TempDir() + "/loadgen_dataset.jsonl";
  std::ofstream(path) << "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n";
  DatasetOptions o;
  o.kind = DatasetKind::kFile;
  o.file = path;
  o.num_prompts = 5;
  auto cycled = BuildDataset(o);
  ASSERT_TRUE(cycled.ok()) << cycled.status();
  ASSERT_EQ(cycled->size(), 5u);
  EXPECT_EQ((*cycled)[4].prompt_text, "a");
  std::remove(path.c_str());
  o.file = path;
  EXPECT_FALSE(BuildDataset(o).ok());
}

TEST(LoadgenDataset, SafeTokenRange) {
  int32_t lo = 0, hi = 0;
  SafeTokenRange(512, &lo, &hi);
  EXPECT_EQ(lo, 100);
  EXPECT_EQ(hi, 480);
  SafeTokenRange(32000, &lo, &hi);
  EXPECT_EQ(lo, 100);
  EXPECT_EQ(hi, 30000);
}

BenchResult SampleResult(const std::string& label) {
  BenchResult r;
  r.info.label = label;
  r.info.target = "localhost:1";
  r.info.dataset = "mixed";
  r.info.num_prompts = 3;
  r.info.request_rate = std::numeric_limits<double>::infinity();
  r.info.slo.ttft_ms = 150;
  r.records.push_back(FakeStream(0, 0.0, {{0.1, 1}, {0.15, 2}}, 0.2));
  r.records.push_back(FakeStream(1, 0.0, {{0.3, 1}, {0.35, 1}}, 0.4));
  r.records.push_back(FakeStream(2, 0.1, {}, 0.2, kUnavailable));
  r.records[0].stages.push_back({"decode", 0.05});
  r.metrics = ComputeMetrics(r.records, RunDuration(r.records), r.info.slo);
  return r;
}

TEST(LoadgenReport, JsonRoundTrip) {
  const BenchResult r = SampleResult("disaggregated");
  auto back = ResultFromJson(ResultToJson(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->info.label, "disaggregated");
  EXPECT_TRUE(std::isinf(back->info.request_rate));
  EXPECT_EQ(*back->info.slo.ttft_ms, 150);
  EXPECT_EQ(back->metrics.completed, 2);
  EXPECT_EQ(back->metrics.failed, 1);
  EXPECT_EQ(back->metrics.good_requests, 1);
  EXPECT_EQ(back->metrics.total_output_tokens, 5);
  EXPECT_DOUBLE_EQ(back->metrics.ttft_ms.p99, r.metrics.ttft_ms.p99);
  EXPECT_DOUBLE_EQ(back->metrics.tpot_ms.mean, r.metrics.tpot_ms.mean);
  EXPECT_EQ(back->records[0].stages.size(), 1u);
  EXPECT_FALSE(ResultFromJson("{}").ok());
  EXPECT_FALSE(ResultFromJson("nope").ok());
}

TEST(LoadgenReport, SweepJsonRoundTrip) {
  std::vector<SweepPoint> pts;
  for (double rate : {1.0, 2.0, std::numeric_limits<double>::infinity()}) {
    BenchResult r = SampleResult("x");
    r.records[1].is_long = true;
    r.metrics = ComputeMetrics(r.records, RunDuration(r.records), r.info.slo);
    r.metrics.goodput *= rate < 3 ? rate : 0.5;
    pts.push_back({rate, r.metrics});
  }
  SloSpec slo;
  slo.tpot_ms = 40;
  const std::string text = SweepToJson("colocated", pts, slo);
  EXPECT_TRUE(IsSweepJson(text));
  EXPECT_FALSE(IsSweepJson(ResultToJson(SampleResult("y"))));
  EXPECT_FALSE(IsSweepJson("garbage"));
  auto back = SweepFromJson(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->label, "colocated");
  EXPECT_EQ(*back->slo.tpot_ms, 40);
  ASSERT_EQ(back->points.size(), 3u);
  EXPECT_TRUE(std::isinf(back->points[2].request_rate));
  EXPECT_EQ(PeakGoodputIndex(back->points), 1);
  EXPECT_DOUBLE_EQ(back->points[1].metrics.ttft_ms.p99,
                   pts[1].metrics.ttft_ms.p99);
  EXPECT_EQ(back->points[0].metrics.errors_by_code.at("UNAVAILABLE"), 1);
  ASSERT_EQ(back->points[0].metrics.by_class.size(), 2u);
  EXPECT_DOUBLE_EQ(back->points[0].metrics.by_class.at("long").ttft_ms.median,
                   pts[0].metrics.by_class.at("long").ttft_ms.median);
  EXPECT_EQ(FormatSweep(back->points, back->slo), FormatSweep(pts, slo));
}

TEST(LoadgenReport, TextReportAndComparison) {
  const BenchResult r = SampleResult("colocated");
  const std::string text = FormatReport(r);
  EXPECT_THAT(text, HasSubstr("Requests (ok/failed/total):        2/1/3"));
  EXPECT_THAT(text, HasSubstr("UNAVAILABLE:"));
  EXPECT_THAT(text, HasSubstr("P99 TPOT (ms):"));
  EXPECT_THAT(text, HasSubstr("decode:"));
  const std::string cmp = FormatComparison({r, SampleResult("disaggregated")});
  EXPECT_THAT(cmp, HasSubstr("colocated"));
  EXPECT_THAT(cmp, HasSubstr("disaggregated"));
  EXPECT_THAT(cmp, HasSubstr("TPOT p99 (ms)"));
  ProgressSnapshot p{10, 4, 1, 3, 200, 2.0};
  EXPECT_EQ(FormatProgress(p),
            "[bench] 4/10 done, 3 in flight, 1 failed, 2.0 s, 100.0 out tok/s");
}

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t pos = s.find(what); pos != std::string::npos;
       pos = s.find(what, pos + 1)) {
    ++n;
  }
  return n;
}

TEST(LoadgenPlot, BenchSvgHasCdfsAndTimeline) {
  const BenchResult a = SampleResult("colocated");
  const BenchResult b = SampleResult("disaggregated");
  const std::string svg = RenderBenchSvg({a, b});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("</svg>"));
  // Four CDF panels with one curve per run (ITL has data in both runs).
  EXPECT_EQ(Count(svg, "<polyline"), 8);
  // Failed requests are drawn in red, once per run.
  EXPECT_EQ(Count(svg, "fill=\"#d62728\""), 2 + 1 /*legend*/ * 2);
  EXPECT_THAT(svg, HasSubstr("Per-request timeline: disaggregated"));
}

TEST(LoadgenPlot, SweepSvgAndTicks) {
  std::vector<SweepPoint> pts(3);
  for (int i = 0; i < 3; ++i) {
    pts[i].request_rate = 1 << i;
    pts[i].metrics.goodput = i == 1 ? 1.8 : 0.9;
    pts[i].metrics.slo_attainment = 1.0 - 0.3 * i;
  }
  const std::string svg = RenderSweepSvg({pts}, {"disaggregated"}, SloSpec{});
  EXPECT_THAT(svg, HasSubstr("peak 1.80 req/s @ 2"));
  EXPECT_EQ(Count(svg, "<polyline"), 2);  // goodput + attainment
  EXPECT_THAT(NiceTicks(9.3, 5), ElementsAre(0, 2, 4, 6, 8, 10));
  EXPECT_THAT(NiceTicks(1.0, 4), ElementsAre(0, 0.25, 0.5, 0.75, 1.0));
  EXPECT_THAT(NiceTicks(12, 5), ElementsAre(0, 5, 10, 15));  // no 2.5 steps
}

}  // namespace
}  // namespace pdserve::loadgen
