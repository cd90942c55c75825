// Failure handling with real processes: a decode or prefill worker killed
// with SIGKILL mid-request, a corrupted KV push, a push that stops halfway
// (lease expiry), KV from a different model, and a decode worker too full
// for a request (the router retries another).
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/metrics/prometheus_text.h"
#include "common/util/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

// What one client stream saw.
struct Outcome {
  absl::Status status;
  std::vector<int32_t> output_ids;
  absl::Time end;
};

// Streams `req`, bumping `tokens_seen` per token received.
Outcome StreamOnce(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                   std::atomic<int>* tokens_seen) {
  Outcome o;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    for (const auto& t : msg.tokens()) {
      o.output_ids.push_back(t.id());
      if (tokens_seen != nullptr) tokens_seen->fetch_add(1);
    }
  }
  o.status = FromGrpcStatus(reader->Finish());
  o.end = absl::Now();
  return o;
}

// Runs `n` concurrent streams; `during` is called once every stream has
// received at least `min_tokens` tokens (or after `wait` when min_tokens < 0).
std::vector<Outcome> RunConcurrently(v1::Generation::Stub& stub,
                                     const v1::GenerateRequest& req, int n,
                                     int min_tokens, absl::Duration wait,
                                     const std::function<void()>& during) {
  std::vector<Outcome> out(n);
  std::vector<std::atomic<int>> seen(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] { out[i] = StreamOnce(stub, req, &seen[i]); });
  }
  if (min_tokens >= 0) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (int i = 0; i < n && absl::Now() < deadline; ++i) {
      while (seen[i].load() < min_tokens && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(5));
      }
    }
  } else {
    absl::SleepFor(wait);
  }
  during();
  for (auto& t : threads) t.join();
  return out;
}

TEST(FailureTest, DecodeWorkerKilledMidStream) {
  ClusterOptions o;
  o.prefill = 1;
  o.decode = 2;
  o.decode_flags = {"--testonly_stream_delay_ms=30"};
  // Migration off: the streams on the killed worker fail (see
  // service_migration_test.cc for migration on).
  o.router_flags = {"--max_migrations=0"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const ReferenceCase ref = LoadReferenceCases()[0];
  const v1::GenerateRequest req =
      IdsRequest(ref.prompt_ids, ref.max_new_tokens);
  absl::Time killed;
  auto outcomes =
      RunConcurrently(c.router(), req, 6, 2, absl::ZeroDuration(), [&] {
        killed = absl::Now();
        c.decode(0).proc.Signal(SIGKILL);
      });
  int failed = 0, succeeded = 0;
  for (const Outcome& out : outcomes) {
    if (out.status.ok()) {
      ++succeeded;
      EXPECT_EQ(out.output_ids, ref.output_ids);
    } else {
      ++failed;
      EXPECT_TRUE(absl::IsUnavailable(out.status)) << out.status;
      EXPECT_TRUE(
          absl::StrContains(out.status.message(), c.decode(0).address()))
          << out.status;
      EXPECT_LT(out.end - killed, absl::Seconds(2))
          << "stream hung after the kill";
      EXPECT_FALSE(out.output_ids.empty());
    }
  }
  EXPECT_GT(failed, 0) << "no stream was on the killed worker";
  EXPECT_GT(succeeded, 0) << "no stream was on the surviving worker";
  // New requests are routed around the dead worker.
  for (int i = 0; i < 4; ++i) {
    auto r = RunGenerate(c.router(), IdsRequest(ref.prompt_ids, 10),
                         absl::Seconds(30));
    ASSERT_TRUE(r.ok()) << r.status() << c.Logs();
    EXPECT_EQ(r->output_ids, std::vector<int32_t>(ref.output_ids.begin(),
                                                  ref.output_ids.begin() + 10));
  }
  {
    absl::Status s = c.WaitForNoKvInUse(absl::Seconds(15));
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(FailureTest, PrefillWorkerKilledMidPrefill) {
  ClusterOptions o;
  o.prefill = 2;
  o.decode = 1;
  o.prefill_flags = {"--testonly_prefill_delay_ms=800"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const ReferenceCase ref = LoadReferenceCases()[1];
  const v1::GenerateRequest req =
      IdsRequest(ref.prompt_ids, ref.max_new_tokens);
  absl::Time killed;
  int in_prefill_on_p0 = 0;
  auto outcomes =
      RunConcurrently(c.router(), req, 4, -1, absl::Milliseconds(300), [&] {
        auto st = c.Status(c.prefill(0));
        ASSERT_TRUE(st.ok());
        in_prefill_on_p0 = st->running();
        killed = absl::Now();
        c.prefill(0).proc.Signal(SIGKILL);
      });
  EXPECT_GT(in_prefill_on_p0, 0)
      << "no request was prefilling on the killed worker";
  for (const Outcome& out : outcomes) {
    if (out.status.ok()) {
      // Retried on the other prefill worker before any token was sent.
      EXPECT_EQ(out.output_ids, ref.output_ids);
    } else {
      EXPECT_TRUE(absl::IsUnavailable(out.status)) << out.status;
      EXPECT_FALSE(out.status.message().empty());
      EXPECT_LT(out.end - killed, absl::Seconds(2));
    }
  }
  auto r = RunGenerate(c.router(), req, absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status() << c.Logs();
  EXPECT_EQ(r->output_ids, ref.output_ids);
  {
    absl::Status s = c.WaitForNoKvInUse(absl::Seconds(15));
    EXPECT_TRUE(s.ok()) << s;
  }
}

// With every prefill worker down, the decode worker prefills the request
// itself (--colocated_fallback, the default): the same output, the decision
// named; with the fallback off the request fails UNAVAILABLE, naming the
// missing pool.
TEST(FailureTest, NoPrefillWorkerFallsBackToPrefillOnDecode) {
  for (bool fallback : {true, false}) {
    SCOPED_TRACE(fallback ? "fallback on" : "fallback off");
    ClusterOptions o;
    // Without the fallback the request waits for a prefill worker for 1 s
    // (--worker_wait) before it fails.
    o.router_flags = {absl::StrCat("--colocated_fallback=", fallback),
                      "--worker_wait=1s"};
    auto cluster = Cluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    Cluster& c = **cluster;
    c.prefill(0).proc.Signal(SIGKILL);
    (void)c.prefill(0).proc.Wait(absl::Seconds(5));
    const ReferenceCase ref = LoadReferenceCases()[0];
    auto r =
        RunGenerate(c.router(), IdsRequest(ref.prompt_ids, ref.max_new_tokens),
                    absl::Seconds(30));
    // A prompt-only request (max_tokens 0, scored), which a prefill worker
    // would compute, falls back the same way.
    v1::GenerateRequest only = IdsRequest(ref.prompt_ids, 0);
    only.set_prompt_logprobs(2);
    auto scored = RunGenerate(c.router(), only, absl::Seconds(30));
    if (fallback) {
      ASSERT_TRUE(r.ok()) << r.status() << c.Logs();
      EXPECT_EQ(r->output_ids, ref.output_ids);
      EXPECT_EQ(r->timings.prefill_location(), "decode_worker");
      EXPECT_EQ(r->timings.prefill_decision().reason(), "no_prefill_worker");
      ASSERT_TRUE(scored.ok()) << scored.status() << c.Logs();
      EXPECT_TRUE(scored->output_ids.empty());
      EXPECT_EQ(scored->prompt_logprobs.size(), ref.prompt_ids.size() - 1);
      EXPECT_EQ(scored->timings.prefill_location(), "decode_worker");
      EXPECT_EQ(scored->timings.prefill_decision().reason(),
                "no_prefill_worker");
    } else {
      ASSERT_FALSE(scored.ok());
      EXPECT_TRUE(absl::IsUnavailable(scored.status())) << scored.status();
      ASSERT_FALSE(r.ok());
      EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
      EXPECT_THAT(std::string(r.status().message()),
                  ::testing::HasSubstr("prefill worker"));
      EXPECT_THAT(std::string(r.status().message()),
                  ::testing::HasSubstr("waited 1s for one (--worker_wait)"));
    }
    absl::Status s = c.WaitForNoKvInUse(absl::Seconds(15));
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Three routers share one prefill worker that holds 2 prompts (one
// computing, --max_prefill_queue=1 waiting): each router's admission bound
// lets its request through, the prefill worker refuses the third as full,
// and that request is prefilled by the decode worker instead (the decision
// named), with the same output as the others.
// (Before, the decision read no_prefill_worker, as if the pool were down.)
TEST(FailureTest, APrefillWorkerThatRefusesForLoadFallsBackToDecode) {
  ClusterOptions o;
  o.modes = {"disaggregated", "disaggregated", "disaggregated"};
  // Long enough that the three requests meet in the prefill worker.
  o.prefill_flags = {"--max_prefill_queue=1",
                     "--testonly_prefill_delay_ms=3000"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const ReferenceCase ref = LoadReferenceCases()[0];
  std::vector<absl::StatusOr<GenerateResult>> results(
      3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      results[r] = RunGenerate(c.router(r),
                               IdsRequest(ref.prompt_ids, ref.max_new_tokens),
                               absl::Seconds(60));
    });
  }
  for (auto& t : threads) t.join();
  std::map<std::string, int> reasons;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status() << c.Logs();
    EXPECT_EQ(r->output_ids, ref.output_ids);
    ++reasons[absl::StrCat(r->timings.prefill_location(), "/",
                           r->timings.prefill_decision().reason())];
  }
  // One refused at least (two when the second arrived before the first
  // left the queue); nothing else.
  EXPECT_GE(reasons["decode_worker/prefill_workers_full"], 1) << c.Logs();
  EXPECT_EQ(reasons["prefill_worker/mode"] +
                reasons["decode_worker/prefill_workers_full"],
            3)
      << c.Logs();
  absl::Status s = c.WaitForNoKvInUse(absl::Seconds(15));
  EXPECT_TRUE(s.ok()) << s;
}

// With the only decode worker down (and nothing restarting it), a request
// waits --worker_wait for one, then fails UNAVAILABLE saying so; with 0 it
// fails at once; its own deadline, or the client going away, ends the wait
// first (DEADLINE_EXCEEDED, CANCELLED). A prompt-only request, which ends on
// the prefill worker, is still served.
// (UpTest.RequestsWaitForARestartingDecodeWorker: the worker comes back.)
TEST(FailureTest, NoDecodeWorkerWaitsThenFails) {
  for (const std::string wait : {"0s", "1s", "10s"}) {
    SCOPED_TRACE(wait);
    ClusterOptions o;
    o.router_flags = {"--worker_wait=" + wait};
    o.common_flags = {"--metrics_port=-1"};
    auto cluster = Cluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    Cluster& c = **cluster;
    c.decode(0).proc.Signal(SIGKILL);
    (void)c.decode(0).proc.Wait(absl::Seconds(5));
    const ReferenceCase ref = LoadReferenceCases()[0];
    // 10s: the client's 1.5 s deadline comes first.
    auto r = RunGenerate(
        c.router(), IdsRequest(ref.prompt_ids, 8),
        wait == "10s" ? absl::Milliseconds(1500) : absl::Seconds(30));
    ASSERT_FALSE(r.ok());
    const std::string message(r.status().message());
    if (wait == "10s") {
      EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
    } else {
      EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
      EXPECT_THAT(message, ::testing::HasSubstr("no healthy decode worker"));
    }
    if (wait == "1s") {
      EXPECT_THAT(message,
                  ::testing::HasSubstr("waited 1s for one (--worker_wait)"));
    } else {
      EXPECT_THAT(message, ::testing::Not(::testing::HasSubstr("waited")));
    }
    if (wait == "0s") {
      // Scoring a prompt needs no decode worker: P computes it and answers.
      // (Before, the router picked a decode worker first and failed this.)
      v1::GenerateRequest only = IdsRequest(ref.prompt_ids, 0);
      only.set_prompt_logprobs(1);
      auto scored = RunGenerate(c.router(), only, absl::Seconds(30));
      ASSERT_TRUE(scored.ok()) << scored.status() << c.Logs();
      EXPECT_TRUE(scored->output_ids.empty());
      EXPECT_EQ(scored->prompt_logprobs.size(), ref.prompt_ids.size() - 1);
      EXPECT_EQ(scored->timings.prefill_location(), "prefill_worker");
      EXPECT_EQ(scored->timings.prefill_decision().reason(), "prompt_only");
    }
    if (wait == "10s") {
      // A client that goes away while its request waits ends it at once.
      grpc::ClientContext ctx;
      auto reader = c.router().Generate(&ctx, IdsRequest(ref.prompt_ids, 8));
      absl::SleepFor(absl::Milliseconds(300));
      const absl::Time cancelled = absl::Now();
      ctx.TryCancel();
      v1::GenerateResponse msg;
      EXPECT_FALSE(reader->Read(&msg));
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
      EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
    }
    // Nothing is left running in the router (the cancel reaches it a
    // moment after the client saw CANCELLED).
    metrics::PrometheusSamples m = ScrapeRole(c.router_process());
    for (int i = 0;
         i < 100 && m.Get("pdserve_requests_in_flight").value_or(-1) != 0;
         ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      m = ScrapeRole(c.router_process());
    }
    EXPECT_EQ(m.Get("pdserve_requests_in_flight").value_or(-1), 0);
    EXPECT_EQ(m.Get("pdserve_request_worker_waits_total").value_or(-1),
              wait == "0s" ? 0 : (wait == "10s" ? 2 : 1));
    absl::Status s = c.WaitForNoKvInUse(absl::Seconds(15));
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(FailureTest, CorruptedPushIsDataLossAndNoTokens) {
  ClusterOptions o;
  o.prefill_flags = {"--testonly_corrupt_kv_push=1"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const ReferenceCase ref = LoadReferenceCases()[0];
  std::atomic<int> seen{0};
  Outcome out = StreamOnce(c.router(), IdsRequest(ref.prompt_ids, 20), &seen);
  EXPECT_TRUE(absl::IsDataLoss(out.status)) << out.status;
  EXPECT_TRUE(absl::StrContains(out.status.message(), "checksum"))
      << out.status;
  EXPECT_EQ(seen.load(), 0) << "tokens were produced from corrupted KV";
  auto d = c.Status(c.decode(0));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->checksum_failures(), 1);
  {
    absl::Status s = c.WaitForNoKvInUse(absl::Seconds(10));
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(FailureTest, HalfPushIsFreedAtLeaseExpiry) {
  ClusterOptions o;
  o.prefill_flags = {"--testonly_stop_kv_push_after_chunks=2"};
  o.decode_flags = {"--kv_lease_seconds=1"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const ReferenceCase ref = LoadReferenceCases()[0];
  Outcome out;
  std::thread client([&] {
    out = StreamOnce(c.router(), IdsRequest(ref.prompt_ids, 20), nullptr);
  });
  // The decode worker holds blocks for the stalled push...
  bool saw_reserved = false;
  for (int i = 0; i < 200 && !saw_reserved; ++i) {
    auto d = c.Status(c.decode(0));
    ASSERT_TRUE(d.ok());
    saw_reserved =
        d->pending_leases() == 1 && d->free_kv_blocks() < d->total_kv_blocks();
    absl::SleepFor(absl::Milliseconds(10));
  }
  client.join();
  EXPECT_TRUE(saw_reserved);
  EXPECT_TRUE(absl::IsUnavailable(out.status)) << out.status;
  EXPECT_TRUE(out.output_ids.empty());
  // ...and frees them when the lease expires.
  {
    absl::Status s = c.WaitForNoKvInUse(absl::Seconds(10));
    EXPECT_TRUE(s.ok()) << s;
  }
  auto d = c.Status(c.decode(0));
  ASSERT_TRUE(d.ok());
  EXPECT_GE(d->lease_expiries(), 1);
}

TEST(FailureTest, KvFromADifferentModelIsRefused) {
  ClusterOptions o;
  // Same KV layout (f32), different weights dtype: a different fingerprint.
  o.decode_flags = {"--dtype=bf16", "--kv_dtype=f32"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  auto p = c.Status(c.prefill(0));
  auto d = c.Status(c.decode(0));
  ASSERT_TRUE(p.ok() && d.ok());
  ASSERT_NE(p->model_fingerprint(), d->model_fingerprint());
  Outcome out = StreamOnce(
      c.router(), IdsRequest(LoadReferenceCases()[0].prompt_ids, 10), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(out.status)) << out.status;
  EXPECT_TRUE(absl::StrContains(out.status.message(), "different model"))
      << out.status;
  EXPECT_TRUE(out.output_ids.empty());
  {
    absl::Status s = c.WaitForNoKvInUse(absl::Seconds(10));
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(FailureTest, FullDecodeWorkerRefusesAndAnotherOneServes) {
  // decode0's KV pool holds 2 blocks (32 tokens); every reference request
  // needs prompt + max_tokens > 32. decode0 does not report its pool's size
  // (as a worker restarted with a smaller pool since the router's last poll,
  // or one of an older release): while a long (slowed) stream runs on
  // decode1, the router sees decode0 as the less loaded worker and tries it
  // first, the push is refused (OUT_OF_RANGE), and the router retries on
  // decode1. (Admission.ARequestLargerThanAWorkersKvPoolGoesToOneThatHoldsIt
  // covers workers that report their size: the router skips them.)
  ClusterOptions o;
  o.decode = 2;
  o.decode_flags_of[0] = {"--kv_cache_memory=40KiB",
                          "--testonly_hide_kv_pool_size"};
  o.decode_flags_of[1] = {"--testonly_stream_delay_ms=20"};
  o.common_flags = {"--metrics_port=-1"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  auto d0 = c.Status(c.decode(0));
  ASSERT_TRUE(d0.ok()) << d0.status();
  ASSERT_EQ(d0->total_kv_blocks(), 2) << "the test needs a 2-block pool";
  const auto cases = LoadReferenceCases();

  // The long stream (it fits only decode1, wherever the router tries first).
  v1::GenerateRequest long_req = IdsRequest(cases[0].prompt_ids, 400);
  long_req.set_ignore_eos(true);
  std::atomic<int> long_tokens{0};
  Outcome long_out;
  std::thread long_thread(
      [&] { long_out = StreamOnce(c.router(), long_req, &long_tokens); });
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (long_tokens.load() == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(long_tokens.load(), 0) << c.Logs();
  const double retries_before = [&] {
    auto m =
        metrics::ScrapeMetrics("127.0.0.1", c.router_process().metrics_port);
    return m.ok() ? m->Get("pdserve_request_retries_total").value_or(0) : -1;
  }();

  // One at a time, so that decode0 is always the less loaded worker.
  for (size_t i = 0; i < cases.size(); ++i) {
    Outcome out = StreamOnce(
        c.router(), IdsRequest(cases[i].prompt_ids, cases[i].max_new_tokens),
        nullptr);
    ASSERT_TRUE(out.status.ok()) << out.status << c.Logs();
    EXPECT_EQ(out.output_ids, cases[i].output_ids) << "case " << i;
  }
  EXPECT_LT(long_tokens.load(), 400) << "the long stream ended too early";
  long_thread.join();
  ASSERT_TRUE(long_out.status.ok()) << long_out.status;
  EXPECT_EQ(long_out.output_ids.size(), 400u);

  auto router =
      metrics::ScrapeMetrics("127.0.0.1", c.router_process().metrics_port);
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_GE(
      router->Get("pdserve_request_retries_total").value_or(0) - retries_before,
      static_cast<double>(cases.size()))
      << "every request should have been refused by decode0 first";
  auto d1 = c.Status(c.decode(1));
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_EQ(d1->requests_completed(), static_cast<int64_t>(cases.size()) + 1);
  absl::Status s = c.WaitForNoKvInUse(absl::Seconds(10));
  EXPECT_TRUE(s.ok()) << s;
}

TEST(FailureTest, SigtermDrainsInFlightStreams) {
  ClusterOptions o;
  o.prefill = 1;
  o.decode = 2;
  o.decode_flags = {"--testonly_stream_delay_ms=20",
                    "--drain_timeout_seconds=20"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const ReferenceCase ref = LoadReferenceCases()[0];
  const v1::GenerateRequest req =
      IdsRequest(ref.prompt_ids, ref.max_new_tokens);
  auto outcomes = RunConcurrently(c.router(), req, 4, 2, absl::ZeroDuration(),
                                  [&] { c.decode(0).proc.Signal(SIGTERM); });
  for (const Outcome& out : outcomes) {
    ASSERT_TRUE(out.status.ok()) << out.status << c.Logs();
    EXPECT_EQ(out.output_ids, ref.output_ids);
  }
  auto st = c.decode(0).proc.Wait(absl::Seconds(20));
  ASSERT_TRUE(st.ok()) << "drained worker did not exit";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
      << DescribeWaitStatus(*st);
  auto r = RunGenerate(c.router(), req, absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output_ids, ref.output_ids);
}

TEST(DiscoveryTest, DnsNamesAreResolvedAndUnhealthyEndpointsSkipped) {
  TempDir dir;
  auto p = StartRole({"prefill", {}}, "prefill", dir.path());
  ASSERT_TRUE(p.ok()) << p.status();
  auto d = StartRole({"decode", {}}, "decode", dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  // "localhost" may also resolve to ::1, where nothing listens: that endpoint
  // stays unhealthy and is routed around. A dead static entry as well.
  auto dead_port = PickFreePort();
  ASSERT_TRUE(dead_port.ok());
  auto r = StartRole(
      {"router",
       {"--worker_poll_ms=100", "--dns_refresh_seconds=1",
        absl::StrCat("--prefill_workers=dns:///localhost:", (*p)->port),
        absl::StrCat("--decode_workers=dns:///localhost:", (*d)->port,
                     ",127.0.0.1:", *dead_port)}},
      "router", dir.path());
  ASSERT_TRUE(r.ok()) << r.status();
  auto stub = v1::Generation::NewStub(
      MakeChannel((*r)->address(), grpc::InsecureChannelCredentials()));
  const ReferenceCase ref = LoadReferenceCases()[1];
  absl::StatusOr<GenerateResult> result = absl::UnavailableError("not run");
  for (int i = 0; i < 100; ++i) {
    result = RunGenerate(*stub, IdsRequest(ref.prompt_ids, ref.max_new_tokens),
                         absl::Seconds(10));
    if (result.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));  // first health checks pending
  }
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output_ids, ref.output_ids);
  for (int i = 0; i < 5; ++i) {
    auto again =
        RunGenerate(*stub, IdsRequest(ref.prompt_ids, 5), absl::Seconds(10));
    EXPECT_TRUE(again.ok()) << again.status();
  }
}

}  // namespace
}  // namespace pdserve::testing
