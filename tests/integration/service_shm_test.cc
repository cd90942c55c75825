// The same-host shared-memory KV transport in the service: with P and D on
// one host, --kv_transport=shm pushes every KV through shared
// memory (asserted on the prefill worker's pdserve_kv_pushes_total and
// kv_pushes_ok), and the outputs equal the reference and those of a cluster
// forced onto --kv_transport=grpc; a corrupted shared-memory chunk fails
// like a corrupted gRPC chunk. After every test: no KV block in use on any
// worker and no KV segment of this test's processes left in /dev/shm once
// the prefill workers' segment pools went idle; after the clusters are
// killed, their probes are swept as stale.
#include <dirent.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/metrics/prometheus_text.h"
#include "common/transport/shm_segment.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

// /dev/shm entries named "<prefix without '/'><pid>-...".
std::vector<std::string> SegmentsOf(const char* prefix, pid_t pid) {
  const std::string want = absl::StrCat(prefix + 1, pid, "-");
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    if (absl::StartsWith(e->d_name, want)) out.push_back(e->d_name);
  }
  closedir(dir);
  return out;
}

double PushesBy(const RoleProcess& p, const std::string& transport) {
  auto s = metrics::ScrapeMetrics("127.0.0.1", p.metrics_port);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return -1;
  auto v = s->Get("pdserve_kv_pushes_total", {{"transport", transport}});
  EXPECT_TRUE(v.has_value())
      << "no pdserve_kv_pushes_total{transport=\"" << transport << "\"}";
  return v.value_or(-1);
}

class ShmTransportTest : public ::testing::Test {
 protected:
  static Cluster* Start(const std::string& kv_transport,
                        std::vector<std::string> extra = {}) {
    ClusterOptions o;
    o.prefill = 1;
    o.decode = 1;
    o.common_flags = {"--metrics_port=-1"};
    o.prefill_flags = {"--kv_transport=" + kv_transport};
    for (auto& f : extra) o.prefill_flags.push_back(f);
    auto c = Cluster::Start(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->release() : nullptr;
  }
  static void SetUpTestSuite() {
    shm_ = Start("shm");  // auto prefers UCX (service_ucx_test)
    grpc_ = Start("grpc");
    cases_ = LoadReferenceCases();
  }
  static void TearDownTestSuite() {
    std::vector<pid_t> pids;
    for (Cluster* c : {shm_, grpc_}) {
      if (c == nullptr) continue;
      pids.push_back(c->decode(0).proc.pid());
      pids.push_back(c->prefill(0).proc.pid());
    }
    // SIGKILLs: the decode workers' probes (and pooled segments of a prefill
    // worker killed within 2 s of a push) stay behind...
    delete shm_;
    delete grpc_;
    shm_ = grpc_ = nullptr;
    // ...until a worker's sweep (at startup, then every 10 s) removes them.
    transport::SweepStaleShmSegments(absl::ZeroDuration());
    for (pid_t pid : pids) {
      EXPECT_TRUE(SegmentsOf(transport::kShmProbePrefix, pid).empty())
          << "probe of " << pid << " left in /dev/shm";
      EXPECT_TRUE(SegmentsOf(transport::kShmKvPrefix, pid).empty())
          << "KV segment of " << pid << " left in /dev/shm";
    }
  }
  void SetUp() override {
    ASSERT_NE(shm_, nullptr);
    ASSERT_NE(grpc_, nullptr);
    ASSERT_FALSE(cases_.empty());
  }
  // Leak checks after every test.
  void TearDown() override {
    for (Cluster* c : {shm_, grpc_}) {
      absl::Status s = c->WaitForNoKvInUse(absl::Seconds(30));
      EXPECT_TRUE(s.ok()) << s;
      for (int i = 0; i < c->num_prefill(); ++i) {
        const pid_t pid = c->prefill(i).proc.pid();
        // P keeps the segments of its last pushes for reuse for 2 s.
        for (int k = 0;
             k < 500 && !SegmentsOf(transport::kShmKvPrefix, pid).empty();
             ++k) {
          absl::SleepFor(absl::Milliseconds(20));
        }
        EXPECT_TRUE(SegmentsOf(transport::kShmKvPrefix, pid).empty())
            << "KV segment of prefill worker " << pid << " left: "
            << absl::StrJoin(SegmentsOf(transport::kShmKvPrefix, pid), ", ");
      }
    }
  }

  // Waits until P's shm + grpc push counters add up to its acknowledged
  // pushes (the metric is bumped right after D's ack, which may trail the
  // end of the response).
  static void WaitForPushMetrics(Cluster& c, double* shm, double* grpc) {
    for (int i = 0; i < 500; ++i) {
      auto st = c.Status(c.prefill(0));
      ASSERT_TRUE(st.ok()) << st.status();
      *shm = PushesBy(c.prefill(0), "shm");
      *grpc = PushesBy(c.prefill(0), "grpc");
      if (*shm + *grpc == st->kv_pushes_ok()) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    FAIL() << "push metrics never matched kv_pushes_ok";
  }

  static Cluster* shm_;
  static Cluster* grpc_;
  static std::vector<ReferenceCase> cases_;
};
Cluster* ShmTransportTest::shm_ = nullptr;
Cluster* ShmTransportTest::grpc_ = nullptr;
std::vector<ReferenceCase> ShmTransportTest::cases_;

TEST_F(ShmTransportTest, SameHostUsesShmAndMatchesGrpcAndTheReference) {
  // Concurrency 4 so that several pushes share the worker at once.
  for (Cluster* c : {shm_, grpc_}) {
    std::vector<absl::StatusOr<GenerateResult>> out(
        cases_.size(), absl::UnknownError("not run"));
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < cases_.size();) {
          out[i] = RunGenerate(
              c->router(),
              IdsRequest(cases_[i].prompt_ids, cases_[i].max_new_tokens),
              absl::Seconds(60));
        }
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < cases_.size(); ++i) {
      ASSERT_TRUE(out[i].ok()) << out[i].status() << c->Logs();
      EXPECT_EQ(out[i]->output_ids, cases_[i].output_ids)
          << (c == shm_ ? "shm" : "grpc") << " cluster, case " << i;
    }
  }
  double shm = 0, grpc = 0;
  WaitForPushMetrics(*shm_, &shm, &grpc);
  EXPECT_GE(shm, 1);
  EXPECT_EQ(grpc, 0);
  WaitForPushMetrics(*grpc_, &shm, &grpc);
  EXPECT_EQ(shm, 0);
  EXPECT_GE(grpc, 1);
  auto d = shm_->Status(shm_->decode(0));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->checksum_failures(), 0);
}

TEST_F(ShmTransportTest, SeededSamplingIsIdenticalOverShmAndGrpc) {
  for (const ReferenceCase& c : cases_) {
    v1::GenerateRequest req = IdsRequest(c.prompt_ids, 32);
    req.mutable_sampling()->set_temperature(0.8f);
    req.mutable_sampling()->set_seed(5);
    auto a = RunGenerate(shm_->router(), req, absl::Seconds(60));
    auto b = RunGenerate(grpc_->router(), req, absl::Seconds(60));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->output_ids, b->output_ids);
  }
}

// A corrupted chunk in shared memory is caught by D's checksum exactly like
// one on the gRPC stream: the request fails, D counts it, nothing leaks.
TEST_F(ShmTransportTest, CorruptedShmChunkIsDataLoss) {
  std::unique_ptr<Cluster> bad(Start("shm", {"--testonly_corrupt_kv_push=0"}));
  ASSERT_NE(bad, nullptr);
  auto result = RunGenerate(bad->router(), IdsRequest(cases_[0].prompt_ids, 8),
                            absl::Seconds(60));
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsDataLoss(result.status())) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "checksum"))
      << result.status();
  auto d = bad->Status(bad->decode(0));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->checksum_failures(), 1);
  double shm = PushesBy(bad->prefill(0), "shm");
  EXPECT_EQ(shm, 0);  // no push was acknowledged
  EXPECT_TRUE(bad->WaitForNoKvInUse(absl::Seconds(30)).ok());
  const pid_t p = bad->prefill(0).proc.pid();
  EXPECT_TRUE(SegmentsOf(transport::kShmKvPrefix, p).empty());
}

}  // namespace
}  // namespace pdserve::testing
