// pdserve_metrics: the catalogue, the three role bundles served by a real
// MetricsServer and scraped over HTTP, the text parser, stage timings.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/metrics/http_get.h"
#include "common/metrics/metric_defs.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/prometheus_text.h"
#include "common/metrics/router_metrics.h"
#include "common/metrics/stage_timings.h"
#include "common/metrics/worker_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::metrics {
namespace {

using ::testing::HasSubstr;

TEST(PrometheusTextTest, ParsesLabelsEscapesSpecialValuesAndTypes) {
  const char* text =
      "# HELP a_total Things.\n"
      "# TYPE a_total counter\n"
      "a_total{code=\"OK\",x=\"q\\\"uo\\\\te\"} 3\n"
      "a_total{code=\"DATA_LOSS\"} 1.5e3 1700000000000\n"
      "# TYPE h histogram\n"
      "h_bucket{le=\"0.5\"} 1\n"
      "h_bucket{le=\"+Inf\"} 2\n"
      "h_sum 0.75\n"
      "h_count 2\n"
      "g NaN\n"
      "n -Inf\n";
  auto parsed = ParsePrometheusText(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("a_total", {{"code", "OK"}, {"x", "q\"uo\\te"}}), 3);
  EXPECT_EQ(parsed->Get("a_total", {{"code", "DATA_LOSS"}}), 1500);
  EXPECT_EQ(parsed->Sum("a_total"), 1503);
  EXPECT_EQ(parsed->Sum("a_total", {{"code", "OK"}}), 3);
  EXPECT_EQ(parsed->Get("h_bucket", {{"le", "+Inf"}}), 2);
  EXPECT_EQ(parsed->Get("h_count"), 2);
  EXPECT_TRUE(std::isnan(*parsed->Get("g")));
  EXPECT_TRUE(std::isinf(*parsed->Get("n")));
  EXPECT_EQ(parsed->types().at("a_total"), "counter");
  EXPECT_EQ(parsed->types().at("h"), "histogram");
  EXPECT_FALSE(parsed->Get("a_total").has_value());
}

TEST(PrometheusTextTest, RejectsMalformedLines) {
  EXPECT_FALSE(ParsePrometheusText("x{a=\"1\" 2\n").ok());
  EXPECT_FALSE(ParsePrometheusText("x abc\n").ok());
  EXPECT_FALSE(ParsePrometheusText("x 1\nx 2\n").ok());  // duplicate
  EXPECT_FALSE(ParsePrometheusText("{a=\"1\"} 2\n").ok());
  auto status = ParsePrometheusText("ok 1\nbad{ 1\n").status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("line 2"));
}

TEST(MetricDefsTest, NamesAreUniqueWellFormedAndInBaseUnits) {
  std::set<std::string> names;
  for (const MetricDef& def : AllMetricDefs()) {
    const std::string name = def.name;
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_EQ(name.rfind("pdserve_", 0), 0u) << name;
    EXPECT_EQ(FindMetricDef(name), &def);
    const bool counter = def.type == MetricType::kCounter;
    EXPECT_EQ(counter, absl::EndsWith(name, "_total")) << name;
    if (std::string(def.unit) == "seconds") {
      EXPECT_TRUE(absl::EndsWith(name, "_seconds")) << name;
    }
    if (std::string(def.unit) == "bytes") {
      EXPECT_THAT(name, HasSubstr("bytes")) << name;
    }
    // A role label exactly where the metric exists on several roles.
    const bool several_roles =
        std::string(def.roles).find('|') != std::string::npos;
    const std::vector<std::string> labels =
        absl::StrSplit(def.labels, ',', absl::SkipEmpty());
    const bool has_role =
        std::find(labels.begin(), labels.end(), "role") != labels.end();
    EXPECT_EQ(several_roles, has_role) << name;
  }
  EXPECT_EQ(FindMetricDef("pdserve_nope"), nullptr);
}

TEST(MetricDefsTest, BucketsIncreaseAndSpanCpuToGpu) {
  for (const auto& buckets : {LatencyBuckets(), BatchSizeBuckets(),
                              TokenCountBuckets(), BandwidthBuckets()}) {
    ASSERT_FALSE(buckets.empty());
    for (size_t i = 1; i < buckets.size(); ++i) {
      EXPECT_LT(buckets[i - 1], buckets[i]);
    }
  }
  EXPECT_DOUBLE_EQ(LatencyBuckets().front(), 0.0005);
  EXPECT_DOUBLE_EQ(LatencyBuckets().back(), 60);
  EXPECT_DOUBLE_EQ(BatchSizeBuckets().back(), 1024);
}

TEST(StageTimingsTest, NamesRoundTripAndCriticalPathSkipsTransfer) {
  std::set<std::string> names;
  for (Stage s : AllStages()) {
    names.insert(StageName(s));
    EXPECT_EQ(StageFromName(StageName(s)), s);
  }
  EXPECT_EQ(names, (std::set<std::string>{
                       "router_queue", "prefill_queue", "prefill_compute",
                       "kv_transfer", "kv_transfer_tail", "decode_admission",
                       "first_decode_step", "decode"}));
  EXPECT_FALSE(StageFromName("bogus").has_value());

  StageTimings t;
  double expected = 0;
  for (Stage s : AllStages()) {
    const double v = 0.25 * (static_cast<int>(s) + 1);
    t.Set(s, v);
    if (s != Stage::kKvTransfer) expected += v;
  }
  EXPECT_DOUBLE_EQ(t.CriticalPathSeconds(), expected);
  StageTimings colocated;
  colocated.Set(Stage::kRouterQueue, 0.5);
  colocated.Set(Stage::kDecode, 2);
  EXPECT_DOUBLE_EQ(colocated.CriticalPathSeconds(), 2.5);
  EXPECT_EQ(colocated.ToJson(), "{\"router_queue\":0.5,\"decode\":2}");
}

TEST(RouterMetricsTest, TimePerOutputToken) {
  RequestSummary s;
  s.output_tokens = 5;
  s.ttft_seconds = 1.0;
  s.e2e_seconds = 3.0;
  EXPECT_DOUBLE_EQ(*RouterMetrics::TimePerOutputToken(s), 0.5);
  s.output_tokens = 1;
  EXPECT_FALSE(RouterMetrics::TimePerOutputToken(s).has_value());
}

// A server on a free loopback port with all three bundles in one registry
// (a decode worker in colocated mode shares families with the prefill side).
class ServedMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = MetricsServer::Start(
        {.port = kAnyFreePort, .bind_address = "127.0.0.1"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_TRUE(server_->serving());
    ASSERT_GT(server_->port(), 0);
    router_ = std::make_unique<RouterMetrics>(server_->registry());
    prefill_ = std::make_unique<PrefillMetrics>(server_->registry());
    decode_ = std::make_unique<DecodeMetrics>(server_->registry());
  }

  PrometheusSamples Scrape() {
    auto samples = ScrapeMetrics("127.0.0.1", server_->port());
    EXPECT_TRUE(samples.ok()) << samples.status();
    return samples.ok() ? *std::move(samples) : PrometheusSamples();
  }

  std::unique_ptr<MetricsServer> server_;
  std::unique_ptr<RouterMetrics> router_;
  std::unique_ptr<PrefillMetrics> prefill_;
  std::unique_ptr<DecodeMetrics> decode_;
};

TEST_F(ServedMetricsTest, ExportsExactlyTheCatalogueWithItsTypes) {
  // A family with per-endpoint labels has no series (and no TYPE line) until
  // the router knows a worker, as every real router does.
  router_->SetWorkerHealthy("decode", "127.0.0.1:9", true);
  const PrometheusSamples s = Scrape();
  std::set<std::string> exported;
  for (const auto& [name, type] : s.types()) {
    if (name.rfind("pdserve_", 0) == 0) exported.insert(name);
  }
  std::set<std::string> catalogue;
  for (const MetricDef& def : AllMetricDefs()) {
    catalogue.insert(def.name);
    ASSERT_TRUE(s.types().count(def.name)) << def.name;
    EXPECT_EQ(s.types().at(def.name), MetricTypeName(def.type)) << def.name;
  }
  EXPECT_EQ(exported, catalogue);
  // Every series carries exactly the catalogued labels (+ le for buckets).
  for (const PrometheusSample& sample : s.samples()) {
    // prometheus-cpp's own exposer_* metrics are not ours.
    if (sample.name.rfind("pdserve_", 0) != 0) continue;
    std::string family = sample.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (absl::EndsWith(family, suffix) && !FindMetricDef(family)) {
        family.resize(family.size() - std::string(suffix).size());
      }
    }
    const MetricDef* def = FindMetricDef(family);
    ASSERT_NE(def, nullptr) << sample.name;
    std::set<std::string> want =
        absl::StrSplit(def->labels, ',', absl::SkipEmpty());
    if (absl::EndsWith(sample.name, "_bucket")) want.insert("le");
    std::set<std::string> got;
    for (const auto& [k, v] : sample.labels) got.insert(k);
    EXPECT_EQ(got, want) << sample.name;
  }
  // Each role announces itself; stage histograms exist for every stage and
  // status codes are pre-created at 0.
  for (const char* role : {"router", "prefill", "decode"}) {
    EXPECT_EQ(s.Get("pdserve_build_info", {{"role", role}}), 1) << role;
  }
  for (Stage st : AllStages()) {
    EXPECT_EQ(s.Get("pdserve_request_stage_seconds_count",
                    {{"stage", StageName(st)}}),
              0);
  }
  EXPECT_EQ(s.Get("pdserve_requests_total", {{"code", "OK"}}), 0);
  EXPECT_EQ(s.Get("pdserve_requests_total", {{"code", "RESOURCE_EXHAUSTED"}}),
            0);
  EXPECT_EQ(s.Get("pdserve_kv_push_failures_total", {{"reason", "data_loss"}}),
            0);
  // Latency buckets keep their short decimal form (rules match le="0.5").
  EXPECT_TRUE(
      s.Get("pdserve_time_to_first_token_seconds_bucket", {{"le", "0.0025"}})
          .has_value());
  EXPECT_TRUE(
      s.Get("pdserve_time_to_first_token_seconds_bucket", {{"le", "0.5"}})
          .has_value());
}

// promtool's linter (naming, units, help text, histogram consistency) accepts
// what we serve. promtool comes with Debian's `prometheus` package, a test
// dependency (scripts/install_deps.sh).
TEST_F(ServedMetricsTest, PromtoolLintAcceptsTheExposition) {
  router_->SetWorkerHealthy("decode", "127.0.0.1:9", true);
  auto body = HttpGet("127.0.0.1", server_->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  ASSERT_EQ(body->status, 200);
  const std::string path = ::testing::TempDir() + "/pdserve_metrics.txt";
  {
    std::ofstream out(path);
    // Only our families: prometheus-cpp's exposer_* ones are not ours.
    for (absl::string_view line : absl::StrSplit(body->body, '\n')) {
      if (absl::StrContains(line, "pdserve_")) out << line << "\n";
    }
  }
  const std::string cmd = "promtool check metrics < " + path + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int rc = pclose(pipe);
  ASSERT_NE(WEXITSTATUS(rc), 127) << "promtool not installed (Debian package "
                                     "`prometheus`, scripts/install_deps.sh)";
  EXPECT_EQ(rc, 0) << output;
  EXPECT_EQ(output, "") << output;
}

TEST_F(ServedMetricsTest, RouterMetricsMoveByWhatIsObserved) {
  const PrometheusSamples before = Scrape();
  router_->RequestStarted();
  router_->RequestStarted();
  EXPECT_EQ(Scrape().Get("pdserve_requests_in_flight"), 2);

  RequestSummary ok;
  ok.code = absl::StatusCode::kOk;
  ok.prompt_tokens = 7;
  ok.output_tokens = 5;
  ok.ttft_seconds = 0.125;
  ok.e2e_seconds = 1.125;
  for (Stage st : AllStages())
    ok.stages.Set(st, 0.01 * (1 + static_cast<int>(st)));
  router_->ObserveTimeToFirstToken(*ok.ttft_seconds);
  router_->TokensSent(1, std::nullopt);
  router_->TokensSent(3, 0.25);  // one message carrying three tokens
  router_->TokensSent(1, 0.5);
  router_->RequestFinished(ok);

  RequestSummary failed;
  failed.code = absl::StatusCode::kInvalidArgument;
  failed.e2e_seconds = 0.001;
  router_->RequestFinished(failed);

  router_->SetWorkerHealthy("prefill", "127.0.0.1:1", true);
  router_->SetWorkerHealthy("decode", "127.0.0.1:2", false);
  router_->CountRetry();
  router_->CountMigration();
  router_->CountMigration();

  const PrometheusSamples s = Scrape();
  EXPECT_EQ(s.Get("pdserve_requests_in_flight"), 0);
  EXPECT_EQ(s.Get("pdserve_requests_total", {{"code", "OK"}}), 1);
  EXPECT_EQ(s.Get("pdserve_requests_total", {{"code", "INVALID_ARGUMENT"}}), 1);
  EXPECT_EQ(s.Sum("pdserve_requests_total"), 2);
  EXPECT_EQ(s.Get("pdserve_prompt_tokens_total"), 7);
  EXPECT_EQ(s.Get("pdserve_generation_tokens_total"), ok.output_tokens);
  EXPECT_EQ(s.Get("pdserve_time_to_first_token_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(*s.Get("pdserve_time_to_first_token_seconds_sum"), 0.125);
  // 0.125 s falls in the 0.25 bucket but not the 0.1 one.
  EXPECT_EQ(
      s.Get("pdserve_time_to_first_token_seconds_bucket", {{"le", "0.1"}}), 0);
  EXPECT_EQ(
      s.Get("pdserve_time_to_first_token_seconds_bucket", {{"le", "0.25"}}), 1);
  // One inter-token sample per token after the first: 0.25, 0, 0, 0.5.
  EXPECT_EQ(s.Get("pdserve_inter_token_latency_seconds_count"),
            ok.output_tokens - 1);
  EXPECT_DOUBLE_EQ(*s.Get("pdserve_inter_token_latency_seconds_sum"), 0.75);
  // Only the successful request feeds e2e and TPOT.
  EXPECT_EQ(s.Get("pdserve_e2e_request_latency_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(*s.Get("pdserve_e2e_request_latency_seconds_sum"),
                   ok.e2e_seconds);
  EXPECT_EQ(s.Get("pdserve_time_per_output_token_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(*s.Get("pdserve_time_per_output_token_seconds_sum"),
                   (1.125 - 0.125) / 4);
  for (Stage st : AllStages()) {
    EXPECT_EQ(s.Get("pdserve_request_stage_seconds_count",
                    {{"stage", StageName(st)}}),
              1);
    EXPECT_DOUBLE_EQ(
        *s.Get("pdserve_request_stage_seconds_sum", {{"stage", StageName(st)}}),
        *ok.stages.Get(st));
  }
  EXPECT_DOUBLE_EQ(*s.Get("pdserve_request_queue_time_seconds_sum"),
                   *ok.stages.Get(Stage::kRouterQueue) +
                       *ok.stages.Get(Stage::kPrefillQueue));
  EXPECT_EQ(s.Get("pdserve_worker_healthy",
                  {{"endpoint", "127.0.0.1:1"}, {"pool", "prefill"}}),
            1);
  EXPECT_EQ(s.Get("pdserve_worker_healthy",
                  {{"endpoint", "127.0.0.1:2"}, {"pool", "decode"}}),
            0);
  EXPECT_EQ(s.Get("pdserve_request_retries_total"), 1);
  EXPECT_EQ(s.Get("pdserve_request_migrations_total"), 2);
  EXPECT_EQ(before.Get("pdserve_request_migrations_total"), 0);

  router_->RemoveWorker("decode", "127.0.0.1:2");
  EXPECT_FALSE(Scrape()
                   .Get("pdserve_worker_healthy",
                        {{"endpoint", "127.0.0.1:2"}, {"pool", "decode"}})
                   .has_value());
}

TEST_F(ServedMetricsTest, WorkerMetricsMoveByWhatIsObserved) {
  prefill_->SetQueueDepth(3);
  prefill_->ObserveBatch(2, 40);
  prefill_->compute().ObserveCompute(0.02, 30);
  prefill_->compute().ObservePrefixLookup(40, 10);
  prefill_->kv_pool().Set(5, 20);
  prefill_->PushSucceeded(4096, 0.5);
  prefill_->PushFailed(absl::StatusCode::kDataLoss);
  prefill_->PushFailed(absl::StatusCode::kDataLoss);
  prefill_->PushFailed(absl::StatusCode::kUnavailable);

  decode_->SetRunning(4);
  decode_->SetWaiting(1);
  decode_->ObserveStep(4, 0.003);
  decode_->ObserveStep(3, 0.002);
  decode_->AddGeneratedTokens(4);
  decode_->AddGeneratedTokens(3);
  decode_->KvPushReceived(4096);
  decode_->ObserveAdmissionWait(0.001);
  decode_->CountPreemption();
  decode_->CountLeaseExpiry();
  decode_->CountChecksumFailure();
  decode_->kv_pool().Set(30, 40);
  decode_->compute().ObserveCompute(0.01, 6);

  const PrometheusSamples s = Scrape();
  const LabelSet p = {{"role", "prefill"}};
  const LabelSet d = {{"role", "decode"}};
  EXPECT_EQ(s.Get("pdserve_prefill_queue_depth"), 3);
  EXPECT_EQ(s.Get("pdserve_prefill_batch_size_sum"), 2);
  EXPECT_EQ(s.Get("pdserve_prefill_batch_tokens_sum"), 40);
  EXPECT_EQ(s.Get("pdserve_prefill_batch_tokens_bucket", {{"le", "32"}}), 0);
  EXPECT_EQ(s.Get("pdserve_prefill_batch_tokens_bucket", {{"le", "64"}}), 1);
  EXPECT_EQ(s.Get("pdserve_prefill_compute_seconds_count", p), 1);
  EXPECT_EQ(s.Get("pdserve_prefill_compute_seconds_count", d), 1);
  EXPECT_EQ(s.Get("pdserve_prefill_computed_tokens_total", p), 30);
  EXPECT_EQ(s.Get("pdserve_prefill_computed_tokens_total", d), 6);
  EXPECT_EQ(s.Get("pdserve_prefix_cache_queries_tokens_total", p), 40);
  EXPECT_EQ(s.Get("pdserve_prefix_cache_hits_tokens_total", p), 10);
  EXPECT_EQ(s.Get("pdserve_kv_pushed_bytes_total", {{"transport", "grpc"}}),
            4096);
  EXPECT_EQ(s.Get("pdserve_kv_pushed_bytes_total", {{"transport", "ucx"}}), 0);
  EXPECT_EQ(s.Get("pdserve_kv_received_bytes_total", {{"transport", "grpc"}}),
            4096);
  EXPECT_EQ(s.Sum("pdserve_kv_received_bytes_total"),
            s.Sum("pdserve_kv_pushed_bytes_total"));
  EXPECT_EQ(s.Get("pdserve_kv_push_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(*s.Get("pdserve_kv_push_bandwidth_bytes_per_second_sum"),
                   4096 / 0.5);
  EXPECT_EQ(s.Get("pdserve_kv_push_failures_total", {{"reason", "data_loss"}}),
            2);
  EXPECT_EQ(
      s.Get("pdserve_kv_push_failures_total", {{"reason", "unavailable"}}), 1);
  EXPECT_EQ(s.Get("pdserve_kv_blocks_used", p), 5);
  EXPECT_EQ(s.Get("pdserve_kv_blocks_capacity", p), 20);
  EXPECT_DOUBLE_EQ(*s.Get("pdserve_kv_usage_ratio", p), 0.25);
  EXPECT_DOUBLE_EQ(*s.Get("pdserve_kv_usage_ratio", d), 0.75);
  EXPECT_EQ(s.Get("pdserve_decode_running_sequences"), 4);
  EXPECT_EQ(s.Get("pdserve_decode_waiting_sequences"), 1);
  EXPECT_EQ(s.Get("pdserve_decode_batch_size_count"), 2);
  EXPECT_EQ(s.Get("pdserve_decode_batch_size_sum"), 7);
  EXPECT_EQ(s.Get("pdserve_decode_step_seconds_count"), 2);
  EXPECT_EQ(s.Get("pdserve_decode_generated_tokens_total"), 7);
  EXPECT_EQ(s.Get("pdserve_decode_admission_wait_seconds_count"), 1);
  EXPECT_EQ(s.Get("pdserve_decode_preemptions_total"), 1);
  EXPECT_EQ(s.Get("pdserve_kv_lease_expiries_total"), 1);
  EXPECT_EQ(s.Get("pdserve_kv_checksum_failures_total"), 1);
  decode_->kv_pool().Set(0, 0);  // an empty pool reports ratio 0, not NaN
  EXPECT_EQ(Scrape().Get("pdserve_kv_usage_ratio", d), 0);
}

TEST_F(ServedMetricsTest, ConcurrentUpdatesAreAllCounted) {
  constexpr int kThreads = 4, kPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        router_->RequestStarted();
        router_->TokensSent(1, 0.001);
        router_->SetWorkerHealthy("decode", absl::StrCat("w", t), i % 2);
        RequestSummary s;
        s.code = i % 2 ? absl::StatusCode::kOk : absl::StatusCode::kCancelled;
        router_->RequestFinished(s);
        decode_->ObserveStep(1, 0.001);
        decode_->AddGeneratedTokens(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  const PrometheusSamples s = Scrape();
  EXPECT_EQ(s.Get("pdserve_requests_in_flight"), 0);
  EXPECT_EQ(s.Sum("pdserve_requests_total"), kThreads * kPerThread);
  EXPECT_EQ(s.Get("pdserve_requests_total", {{"code", "CANCELLED"}}),
            kThreads * kPerThread / 2);
  EXPECT_EQ(s.Get("pdserve_generation_tokens_total"), kThreads * kPerThread);
  EXPECT_EQ(s.Get("pdserve_decode_step_seconds_count"), kThreads * kPerThread);
  EXPECT_EQ(s.Sum("pdserve_worker_healthy"), kThreads);  // last i is odd
}

TEST(MetricsServerTest, PortZeroDisablesButBundlesStillWork) {
  auto server = MetricsServer::Start({.port = 0});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE((*server)->serving());
  EXPECT_EQ((*server)->port(), 0);
  DecodeMetrics decode((*server)->registry());
  decode.CountLeaseExpiry();
}

TEST(MetricsServerTest, BusyPortFailsWithUnavailable) {
  auto first =
      MetricsServer::Start({.port = kAnyFreePort, .bind_address = "127.0.0.1"});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsServer::Start(
      {.port = (*first)->port(), .bind_address = "127.0.0.1"});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(MetricsServer::Start({.port = 70000}).ok());
}

TEST(HttpGetTest, ReportsStatusAndConnectionErrors) {
  auto server =
      MetricsServer::Start({.port = kAnyFreePort, .bind_address = "127.0.0.1"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto missing = HttpGet("127.0.0.1", (*server)->port(), "/nope");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status, 404);
  const int port = (*server)->port();
  server->reset();  // nothing listens there any more
  auto refused = HttpGet("127.0.0.1", port, "/metrics");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pdserve::metrics
