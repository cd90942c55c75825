// Migration on decode failure meets a client cancel or a request deadline
// (issue 5): a decode worker is killed with SIGKILL mid-stream while
// clients cancel (at the kill, so during the re-prefill, and after tokens of
// the new pair arrived) or their deadlines expire before, during and after
// the migration. Every call ends with CANCELLED / DEADLINE_EXCEEDED (none
// hangs: the router's handlers all return), and afterwards no KV block is in
// use on any surviving worker. The prefill workers sleep before each batch,
// which keeps disaggregated re-prefills in flight for a while.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/metrics/prometheus_text.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

// Streams long enough (ignore_eos, 40 ms per token) that none ends by
// itself before the test cancels it or its deadline passes.
constexpr int kMaxTokens = 300;
constexpr int kStreams = 8;

// One client stream, cancellable from another thread.
struct ClientCall {
  grpc::ClientContext ctx;
  std::atomic<int> tokens{0};
  std::atomic<bool> done{false};
  absl::Status status;  // set before `done`
};

void RunCall(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
             ClientCall* call) {
  auto reader = stub.Generate(&call->ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) call->tokens.fetch_add(msg.tokens_size());
  call->status = FromGrpcStatus(reader->Finish());
  call->done.store(true);
}

// Waits (bounded) until `call` has at least `n` tokens; false if it ended
// or the wait gave up.
bool WaitForTokens(const ClientCall& call, int n) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (call.tokens.load() < n && !call.done.load() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  return call.tokens.load() >= n;
}

metrics::PrometheusSamples Scrape(const RoleProcess& router) {
  return ScrapeRole(router);
}

// The router's handlers have all returned (bounded wait; a hang fails).
absl::Status WaitForRouterIdle(const RoleProcess& router) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  double in_flight = -1;
  while (absl::Now() < give_up) {
    in_flight =
        Scrape(router).Get("pdserve_requests_in_flight", {}).value_or(-1);
    if (in_flight == 0) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("router still has ", in_flight, " requests in flight"));
}

double RouterCount(const metrics::PrometheusSamples& s, const char* code) {
  return s.Get("pdserve_requests_total", {{"code", code}}).value_or(-1);
}

std::unique_ptr<Cluster> StartCluster(const std::string& mode) {
  ClusterOptions o;
  o.prefill = 1;
  o.decode = 2;
  o.modes = {mode};
  o.prefill_flags = {"--testonly_prefill_delay_ms=1500"};
  o.decode_flags = {"--testonly_stream_delay_ms=40"};
  o.router_flags = {"--metrics_port=-1"};
  auto cluster = Cluster::Start(o);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

v1::GenerateRequest LongRequest(const ReferenceCase& c, int i) {
  v1::GenerateRequest r = IdsRequest(c.prompt_ids, kMaxTokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0.8f);
  r.mutable_sampling()->set_seed(100 + i);
  r.mutable_sampling()->set_presence_penalty(0.5f);
  return r;
}

// After the test: the survivors serve a request exactly and hold no KV.
void ExpectHealthyAndNoKv(Cluster& c) {
  const ReferenceCase ref = LoadReferenceCases()[0];
  auto r = RunGenerate(c.router(), IdsRequest(ref.prompt_ids, 10),
                       absl::Seconds(60));
  ASSERT_TRUE(r.ok()) << r.status() << c.Logs();
  EXPECT_EQ(r->output_ids, std::vector<int32_t>(ref.output_ids.begin(),
                                                ref.output_ids.begin() + 10));
  absl::Status s = c.WaitForNoKvInUse(absl::Seconds(20));
  EXPECT_TRUE(s.ok()) << s << c.Logs();
}

class MigrationCancelTest : public ::testing::TestWithParam<std::string> {};

// A third of the clients cancel right at the kill (their stream is then
// being migrated, or still on the surviving worker), the others once 3 more
// tokens came (for a migrated stream: from the new pair).
TEST_P(MigrationCancelTest, ClientCancelDuringAndAfterMigration) {
  auto cluster = StartCluster(GetParam());
  ASSERT_NE(cluster, nullptr);
  Cluster& c = *cluster;
  const auto refs = LoadReferenceCases();
  std::vector<std::unique_ptr<ClientCall>> calls;
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    calls.push_back(std::make_unique<ClientCall>());
    threads.emplace_back(RunCall, std::ref(c.router()),
                         LongRequest(refs[i % refs.size()], i),
                         calls.back().get());
  }
  for (auto& call : calls) EXPECT_TRUE(WaitForTokens(*call, 3));
  std::vector<int> at_kill;
  for (auto& call : calls) at_kill.push_back(call->tokens.load());
  c.decode(0).proc.Signal(SIGKILL);
  for (int i = 0; i < kStreams; i += 3) calls[i]->ctx.TryCancel();
  for (int i = 0; i < kStreams; ++i) {
    if (i % 3 == 0) continue;
    EXPECT_TRUE(WaitForTokens(*calls[i], at_kill[i] + 3)) << "stream " << i;
    calls[i]->ctx.TryCancel();
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(absl::IsCancelled(calls[i]->status))
        << "stream " << i << ": " << calls[i]->status;
  }
  absl::Status idle = WaitForRouterIdle(c.router_process());
  ASSERT_TRUE(idle.ok()) << idle << c.Logs();
  const metrics::PrometheusSamples m = Scrape(c.router_process());
  EXPECT_EQ(RouterCount(m, "CANCELLED"), kStreams);
  const double migrations =
      m.Get("pdserve_request_migrations_total", {}).value_or(-1);
  std::printf("%s: %g migrations before the cancels\n", GetParam().c_str(),
              migrations);
  // The streams cancelled late had continued on the surviving worker.
  EXPECT_GT(migrations, 0) << "no stream was migrated";
  ExpectHealthyAndNoKv(c);
}

// Deadlines staggered over the kill, the migration and the continued
// streams; none of the streams could finish before its deadline.
TEST_P(MigrationCancelTest, DeadlineBeforeDuringAndAfterMigration) {
  auto cluster = StartCluster(GetParam());
  ASSERT_NE(cluster, nullptr);
  Cluster& c = *cluster;
  const auto refs = LoadReferenceCases();
  std::vector<std::unique_ptr<ClientCall>> calls;
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kStreams; ++i) {
    calls.push_back(std::make_unique<ClientCall>());
    calls.back()->ctx.set_deadline(
        absl::ToChronoTime(start + absl::Milliseconds(3500 + 400 * i)));
    threads.emplace_back(RunCall, std::ref(c.router()),
                         LongRequest(refs[i % refs.size()], i),
                         calls.back().get());
  }
  for (auto& call : calls) (void)WaitForTokens(*call, 3);
  c.decode(0).proc.Signal(SIGKILL);
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(calls[i]->status))
        << "stream " << i << ": " << calls[i]->status;
    EXPECT_LT(calls[i]->tokens.load(), kMaxTokens) << "stream " << i;
  }
  absl::Status idle = WaitForRouterIdle(c.router_process());
  ASSERT_TRUE(idle.ok()) << idle << c.Logs();
  const metrics::PrometheusSamples m = Scrape(c.router_process());
  // The router ends a call with DEADLINE_EXCEEDED, or CANCELLED when the
  // client's own expiry reached it first; never anything else.
  const double deadline = RouterCount(m, "DEADLINE_EXCEEDED");
  const double cancelled = RouterCount(m, "CANCELLED");
  std::printf(
      "%s: router ended %g calls DEADLINE_EXCEEDED, %g CANCELLED, "
      "%g migrations\n",
      GetParam().c_str(), deadline, cancelled,
      m.Get("pdserve_request_migrations_total", {}).value_or(-1));
  EXPECT_EQ(deadline + cancelled, kStreams);
  ExpectHealthyAndNoKv(c);
}

INSTANTIATE_TEST_SUITE_P(Modes, MigrationCancelTest,
                         ::testing::Values("disaggregated", "colocated"));

}  // namespace
}  // namespace pdserve::testing
