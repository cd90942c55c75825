// The UCX KV transport in the service (issue 18): with P and D on one host,
// --kv_transport=auto (the default) pushes every KV with UCX (asserted on
// the prefill worker's pdserve_kv_pushes_total / pushed bytes and the decode
// worker's received bytes, by transport), with UCX's default transports and
// with UCX_TLS=tcp, and the outputs equal the reference and a gRPC cluster's;
// a corrupted chunk fails with DATA_LOSS; a worker killed with SIGKILL in the
// middle of a push leaves the survivor with no KV block, no endpoint to the
// dead peer, no UCX operation in flight and no push holding UCX memory.
// With shared memory the decode worker imports the chunks in place from the
// prefill worker's mapped export buffers (kv_ucx_mapped_buffers).
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/prometheus_text.h"
#include "common/util/scoped_env.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

// Sets UCX_TLS for the processes started while it lives ("" = unset).
double Metric(const RoleProcess& p, const std::string& name,
              const metrics::LabelSet& labels) {
  auto s = metrics::ScrapeMetrics("127.0.0.1", p.metrics_port);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return -1;
  auto v = s->Get(name, labels);
  EXPECT_TRUE(v.has_value()) << name << " missing";
  return v.value_or(-1);
}

std::unique_ptr<Cluster> StartCluster(const std::string& tls,
                                      std::vector<std::string> prefill_flags,
                                      std::vector<std::string> decode_flags) {
  ScopedEnv env("UCX_TLS", tls);
  ClusterOptions o;
  o.common_flags = {"--metrics_port=-1"};
  o.prefill_flags = std::move(prefill_flags);
  o.decode_flags = std::move(decode_flags);
  auto c = Cluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// The parameter: UCX_TLS of the workers ("" = UCX's default transports).
class UcxServiceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxServiceTest, AutoPicksUcxAndMatchesGrpcAndTheReference) {
  auto ucx = StartCluster(GetParam(), {"--kv_transport=auto"},
                          {"--kv_transport=auto"});
  auto grpc = StartCluster(GetParam(), {"--kv_transport=grpc"},
                           {"--kv_transport=grpc"});
  ASSERT_NE(ucx, nullptr);
  ASSERT_NE(grpc, nullptr);
  const std::vector<ReferenceCase> cases = LoadReferenceCases();
  ASSERT_FALSE(cases.empty());
  int64_t prompt_tokens = 0;
  for (Cluster* c : {ucx.get(), grpc.get()}) {
    // Concurrency 4: several pushes share the endpoint at once.
    std::vector<absl::StatusOr<GenerateResult>> out(
        cases.size(), absl::UnknownError("not run"));
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < cases.size();) {
          out[i] = RunGenerate(
              c->router(),
              IdsRequest(cases[i].prompt_ids, cases[i].max_new_tokens),
              absl::Seconds(60));
        }
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < cases.size(); ++i) {
      ASSERT_TRUE(out[i].ok()) << out[i].status() << c->Logs();
      EXPECT_EQ(out[i]->output_ids, cases[i].output_ids)
          << (c == ucx.get() ? "ucx" : "grpc") << " cluster, case " << i;
    }
  }
  for (const ReferenceCase& rc : cases) prompt_tokens += rc.prompt_ids.size();
  // Every push of the auto cluster went over UCX (metrics are bumped right
  // after D's ack, which may trail the response).
  auto p = ucx->Status(ucx->prefill(0));
  ASSERT_TRUE(p.ok()) << p.status();
  for (int i = 0; i < 200; ++i) {
    p = ucx->Status(ucx->prefill(0));
    ASSERT_TRUE(p.ok());
    if (Metric(ucx->prefill(0), "pdserve_kv_pushes_total",
               {{"transport", "ucx"}}) == p->kv_pushes_ok()) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(p->kv_pushes_ok(), 1);
  EXPECT_EQ(Metric(ucx->prefill(0), "pdserve_kv_pushes_total",
                   {{"transport", "ucx"}}),
            p->kv_pushes_ok());
  EXPECT_EQ(Metric(ucx->prefill(0), "pdserve_kv_pushes_total",
                   {{"transport", "grpc"}}),
            0);
  const double pushed = Metric(ucx->prefill(0), "pdserve_kv_pushed_bytes_total",
                               {{"transport", "ucx"}});
  EXPECT_EQ(pushed, p->kv_bytes_pushed());
  EXPECT_EQ(Metric(ucx->decode(0), "pdserve_kv_received_bytes_total",
                   {{"transport", "ucx"}}),
            pushed);
  auto d = ucx->Status(ucx->decode(0));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->checksum_failures(), 0);
  EXPECT_EQ(p->kv_ucx_endpoints(), 1);  // one decode worker, cached
  EXPECT_EQ(d->kv_ucx_transfers(), 0);
  EXPECT_EQ(d->kv_ucx_operations(), 0);
  // With shared memory D imported the chunks in place from P's mapped
  // buffers (no copy); over TCP they came as messages.
  if (GetParam().empty()) {
    EXPECT_GT(d->kv_ucx_mapped_buffers(), 0);
  } else {
    EXPECT_EQ(d->kv_ucx_mapped_buffers(), 0);
  }
  EXPECT_GT(p->kv_ucx_registered_bytes(), 0);  // pooled for the next push
  EXPECT_EQ(p->kv_ucx_transfers(), 0);
  EXPECT_EQ(p->kv_ucx_operations(), 0);
  // The gRPC cluster moved its KV inline.
  EXPECT_EQ(Metric(grpc->prefill(0), "pdserve_kv_pushes_total",
                   {{"transport", "ucx"}}),
            0);
  for (Cluster* c : {ucx.get(), grpc.get()}) {
    absl::Status s = c->WaitForNoKvInUse(absl::Seconds(30));
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST_P(UcxServiceTest, CorruptedChunkIsDataLoss) {
  auto c = StartCluster(GetParam(),
                        {"--kv_transport=ucx", "--testonly_corrupt_kv_push=0"},
                        {"--kv_transport=ucx"});
  ASSERT_NE(c, nullptr);
  const ReferenceCase ref = LoadReferenceCases()[0];
  auto result = RunGenerate(c->router(), IdsRequest(ref.prompt_ids, 8),
                            absl::Seconds(60));
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsDataLoss(result.status())) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "checksum"))
      << result.status();
  auto d = c->Status(c->decode(0));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->checksum_failures(), 1);
  EXPECT_EQ(
      Metric(c->prefill(0), "pdserve_kv_pushes_total", {{"transport", "ucx"}}),
      0);  // no push was acknowledged
  absl::Status s = c->WaitForNoKvInUse(absl::Seconds(30));
  EXPECT_TRUE(s.ok()) << s;
}

// Waits until `pred` holds for the worker's status (up to `timeout`).
bool WaitForStatus(
    Cluster& c, const RoleProcess& w, absl::Duration timeout,
    const std::function<bool(const pb::WorkerStatusResponse&)>& pred,
    std::string* last) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto st = c.Status(w);
    if (st.ok()) {
      *last = st->ShortDebugString();
      if (pred(*st)) return true;
    } else {
      *last = st.status().ToString();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// P sends one chunk of each push and stalls (test-only), so every push is
// caught mid-transfer: D holds its blocks and a landing buffer; P holds the
// export region and an endpoint to D.
std::unique_ptr<Cluster> StalledCluster(const std::string& tls) {
  return StartCluster(
      tls, {"--kv_transport=ucx", "--testonly_stop_kv_push_after_chunks=1"},
      {"--kv_transport=ucx", "--kv_lease_seconds=60"});
}

TEST_P(UcxServiceTest, PrefillKilledMidTransferLeavesNothingOnDecode) {
  auto c = StalledCluster(GetParam());
  ASSERT_NE(c, nullptr);
  const ReferenceCase ref = LoadReferenceCases()[0];
  std::thread client([&] {
    (void)RunGenerate(c->router(), IdsRequest(ref.prompt_ids, 8),
                      absl::Seconds(60));
  });
  std::string last;
  const bool mid = WaitForStatus(
      *c, c->decode(0), absl::Seconds(30),
      [](const pb::WorkerStatusResponse& d) {
        return d.kv_ucx_transfers() == 1 && d.pending_leases() == 1 &&
               d.free_kv_blocks() < d.total_kv_blocks();
      },
      &last);
  EXPECT_TRUE(mid) << "never mid-transfer: " << last;
  c->prefill(0).proc.Signal(SIGKILL);
  // D notices the dead peer (its push stream breaks) and frees the blocks
  // and the landing buffer at once (the lease is 60 s); it drops its
  // mappings of P's buffers and the endpoint they were mapped through (or
  // never had one, over TCP), and has no receive left once the stream broke.
  const bool clean = WaitForStatus(
      *c, c->decode(0), absl::Seconds(20),
      [](const pb::WorkerStatusResponse& d) {
        return d.kv_ucx_transfers() == 0 && d.kv_ucx_operations() == 0 &&
               d.kv_ucx_endpoints() == 0 && d.kv_ucx_mapped_buffers() == 0 &&
               d.pending_leases() == 0 &&
               d.free_kv_blocks() == d.total_kv_blocks();
      },
      &last);
  EXPECT_TRUE(clean) << "decode worker still holds: " << last;
  client.join();
  EXPECT_EQ(
      Metric(c->decode(0), "pdserve_kv_ucx_transfers", {{"role", "decode"}}),
      0);
}

TEST_P(UcxServiceTest, DecodeKilledMidTransferLeavesNothingOnPrefill) {
  auto c = StalledCluster(GetParam());
  ASSERT_NE(c, nullptr);
  const ReferenceCase ref = LoadReferenceCases()[0];
  std::thread client([&] {
    (void)RunGenerate(c->router(), IdsRequest(ref.prompt_ids, 8),
                      absl::Seconds(60));
  });
  std::string last;
  const bool mid = WaitForStatus(
      *c, c->decode(0), absl::Seconds(30),
      [](const pb::WorkerStatusResponse& d) {
        return d.kv_ucx_transfers() == 1;
      },
      &last);
  EXPECT_TRUE(mid) << "never mid-transfer: " << last;
  auto p = c->Status(c->prefill(0));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kv_ucx_transfers(), 1);
  c->decode(0).proc.Signal(SIGKILL);
  // P's push fails with the broken stream: its region leaves the push (kept
  // registered in the pool for a while, then unregistered) and, nothing else
  // using it, the endpoint to the dead D is closed.
  const bool clean = WaitForStatus(
      *c, c->prefill(0), absl::Seconds(20),
      [](const pb::WorkerStatusResponse& s) {
        return s.kv_ucx_transfers() == 0 && s.kv_pushes_failed() == 1 &&
               s.free_kv_blocks() == s.total_kv_blocks();
      },
      &last);
  EXPECT_TRUE(clean) << "prefill worker still holds: " << last;
  const bool released = WaitForStatus(
      *c, c->prefill(0), absl::Seconds(30),
      [](const pb::WorkerStatusResponse& s) {
        return s.kv_ucx_registered_bytes() == 0 && s.kv_ucx_endpoints() == 0 &&
               s.kv_ucx_operations() == 0;
      },
      &last);
  EXPECT_TRUE(released) << "prefill worker keeps UCX memory: " << last << "\n"
                        << c->Logs();
  client.join();
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxServiceTest,
                         ::testing::Values("", "tcp"), [](const auto& info) {
                           return info.param.empty() ? std::string("Default")
                                                     : std::string("Tcp");
                         });

}  // namespace
}  // namespace pdserve::testing
