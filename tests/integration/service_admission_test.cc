// Admission control: far more concurrent requests than the router, prefill
// and decode queues hold. The excess is refused at once with
// RESOURCE_EXHAUSTED and a retry-after-ms hint in the trailing metadata
// (instead of queueing forever); every admitted request returns the exact
// reference output; afterwards no KV block is in use on any worker. And the
// router sends no worker more than it holds: a burst beyond the workers'
// limits waits in the router's queue and is served, not refused by them,
// and pushes beyond a decode worker's free KV are served (their generated
// tokens' blocks taken on demand), not refused.
#include <atomic>
#include <csignal>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

struct Outcome {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message;
  std::string retry_after_ms;  // trailing metadata, "" when absent
  std::vector<int32_t> output_ids;
};

Outcome Call(v1::Generation::Stub& stub, const v1::GenerateRequest& req) {
  Outcome o;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    for (const auto& t : msg.tokens()) o.output_ids.push_back(t.id());
  }
  const grpc::Status s = reader->Finish();
  o.code = s.error_code();
  o.message = s.error_message();
  const auto& trailing = ctx.GetServerTrailingMetadata();
  auto it = trailing.find("retry-after-ms");
  if (it != trailing.end()) {
    o.retry_after_ms = std::string(it->second.data(), it->second.size());
  }
  return o;
}

// `clients` requests at once, request i with reference case i mod n.
std::vector<Outcome> Burst(Cluster& c, const std::vector<ReferenceCase>& cases,
                           int clients) {
  std::vector<Outcome> outcomes(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      const ReferenceCase& rc = cases[i % cases.size()];
      outcomes[i] =
          Call(c.router(), IdsRequest(rc.prompt_ids, rc.max_new_tokens));
    });
  }
  for (auto& t : threads) t.join();
  return outcomes;
}

// Every request of a Burst returned its reference output.
void ExpectEveryOneServedExactly(const std::vector<Outcome>& outcomes,
                                 const std::vector<ReferenceCase>& cases) {
  for (size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].code, grpc::StatusCode::OK)
        << "request " << i << ": " << outcomes[i].message;
    EXPECT_EQ(outcomes[i].output_ids, cases[i % cases.size()].output_ids)
        << "request " << i;
  }
}

TEST(Admission, OverloadIsRefusedWithARetryHintAndAdmittedRequestsAreExact) {
  ClusterOptions o;
  o.prefill = 1;
  o.decode = 1;
  // Tiny queues and slow prefills: 48 simultaneous clients cannot all fit.
  o.prefill_flags = {"--max_prefill_queue=2",
                     "--testonly_prefill_delay_ms=300"};
  o.decode_flags = {"--max_waiting_seqs=2", "--max_num_seqs=2"};
  // The router runs 2 at once (what the prefill queue holds) and queues 8.
  o.router_flags = {"--max_in_flight=12", "--admission_queue=8",
                    "--retry_after_ms=250"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const auto cases = LoadReferenceCases();
  ASSERT_FALSE(cases.empty());

  constexpr int kClients = 48;
  const std::vector<Outcome> outcomes = Burst(c, cases, kClients);

  int ok = 0, refused = 0, by_router = 0, by_prefill = 0;
  for (int i = 0; i < kClients; ++i) {
    const Outcome& out = outcomes[i];
    const ReferenceCase& rc = cases[i % cases.size()];
    if (out.code == grpc::StatusCode::OK) {
      ++ok;
      EXPECT_EQ(out.output_ids, rc.output_ids) << "request " << i;
    } else {
      ++refused;
      EXPECT_EQ(out.code, grpc::StatusCode::RESOURCE_EXHAUSTED)
          << "request " << i << ": " << out.message;
      EXPECT_EQ(out.retry_after_ms, "250") << out.message;
      EXPECT_TRUE(out.output_ids.empty()) << "refused after streaming";
      by_router += out.message.find("router overloaded") != std::string::npos;
      by_prefill += out.message.find("prefill queue full") != std::string::npos;
    }
  }
  std::printf(
      "%d admitted, %d refused with RESOURCE_EXHAUSTED (%d by the router's "
      "bound, %d by the prefill queue's)\n",
      ok, refused, by_router, by_prefill);
  EXPECT_GT(ok, 0);
  EXPECT_GT(refused, 0);
  EXPECT_EQ(ok + refused, kClients);
  ASSERT_TRUE(c.WaitForNoKvInUse(absl::Seconds(20)).ok()) << c.Logs();

  // Once the load is gone, the same cluster serves again.
  const Outcome after = Call(
      c.router(), IdsRequest(cases[0].prompt_ids, cases[0].max_new_tokens));
  EXPECT_EQ(after.code, grpc::StatusCode::OK) << after.message;
  EXPECT_EQ(after.output_ids, cases[0].output_ids);
  EXPECT_TRUE(after.retry_after_ms.empty());
}

TEST(Admission, ABurstBeyondTheWorkersLimitsWaitsInTheRouterAndIsServed) {
  ClusterOptions o;
  o.common_flags = {"--metrics_port=-1"};
  // The workers hold 2 prompts (P's queue) and 2 + 2 sequences (D's batch
  // and queue); the router's own bound stays at its default (1024).
  o.prefill_flags = {"--max_prefill_queue=2", "--testonly_prefill_delay_ms=50"};
  o.decode_flags = {"--max_waiting_seqs=2", "--max_num_seqs=2"};
  o.router_flags = {"--admission_timeout=120s"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const auto cases = LoadReferenceCases();
  ASSERT_FALSE(cases.empty());

  constexpr int kClients = 32;
  const std::vector<Outcome> outcomes = Burst(c, cases, kClients);
  ExpectEveryOneServedExactly(outcomes, cases);
  // Nothing was sent to a worker that had no room for it.
  auto p = c.Status(c.prefill(0));
  auto d = c.Status(c.decode(0));
  ASSERT_TRUE(p.ok() && d.ok()) << p.status() << " " << d.status();
  EXPECT_EQ(p->requests_rejected(), 0);
  EXPECT_EQ(p->request_capacity(), 2);
  EXPECT_EQ(d->requests_rejected(), 0);
  EXPECT_EQ(d->request_capacity(), 4);
  EXPECT_EQ(d->lease_expiries(), 0);
  metrics::PrometheusSamples m = ScrapeRole(c.router_process());
  EXPECT_EQ(m.Get("pdserve_admission_limit").value_or(-1), 2);
  EXPECT_EQ(m.Get("pdserve_request_retries_total").value_or(-1), 0);
  EXPECT_EQ(m.Get("pdserve_requests_total", {{"code", "OK"}}).value_or(0),
            kClients);
  // Most of the burst waited in the router's queue (2 ran at once; a
  // straggler that arrives when the queue is empty runs at once too).
  EXPECT_GE(m.Get("pdserve_admission_wait_seconds_count").value_or(0),
            kClients / 2);
  ASSERT_TRUE(c.WaitForNoKvInUse(absl::Seconds(20)).ok()) << c.Logs();
}

// Polls the router's metric until `pred` holds or 20 s pass; returns the
// last value (-1 when absent).
double AwaitRouterMetric(Cluster& c, const std::string& name,
                         const std::map<std::string, std::string>& labels,
                         const std::function<bool(double)>& pred) {
  double v = -1;
  for (int i = 0; i < 200; ++i) {
    v = ScrapeRole(c.router_process()).Get(name, labels).value_or(-1);
    if (pred(v)) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return v;
}

// The only decode worker dies and comes back under load. Meanwhile no
// worker is healthy, and the router keeps the bound the workers last
// reported: the requests that arrive wait in its queue instead of all
// being admitted to wait for a worker (--worker_wait) and then flooding
// the one that comes back, which would refuse what it cannot hold.
TEST(Admission, TheBoundHoldsWhileTheOnlyDecodeWorkerRestarts) {
  ClusterOptions o;
  o.prefill = 0;
  o.modes = {"colocated"};
  o.common_flags = {"--metrics_port=-1"};
  const std::vector<std::string> decode_flags = {
      "--metrics_port=-1", "--max_waiting_seqs=2", "--max_num_seqs=2",
      "--testonly_stream_delay_ms=20"};
  o.decode_flags = decode_flags;
  o.router_flags = {"--admission_timeout=120s", "--worker_wait=60s"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const auto cases = LoadReferenceCases();
  ASSERT_FALSE(cases.empty());
  // One request sets the limit gauge (the decode worker holds 2 + 2).
  ASSERT_EQ(Burst(c, cases, 1)[0].code, grpc::StatusCode::OK);
  EXPECT_EQ(AwaitRouterMetric(c, "pdserve_admission_limit", {},
                              [](double v) { return v == 4; }),
            4);

  const int port = c.decode(0).port;
  const std::string address = c.decode(0).address();
  c.decode(0).proc.Signal(SIGKILL);
  ASSERT_TRUE(c.decode(0).proc.Wait(absl::Seconds(10)).ok());
  ASSERT_EQ(AwaitRouterMetric(c, "pdserve_worker_healthy",
                              {{"pool", "decode"}, {"endpoint", address}},
                              [](double v) { return v == 0; }),
            0)
      << c.Logs();

  constexpr int kClients = 16;
  std::vector<Outcome> outcomes;
  std::thread clients([&] { outcomes = Burst(c, cases, kClients); });
  // The burst arrives while the worker is down; the bound stays.
  EXPECT_GE(AwaitRouterMetric(c, "pdserve_admission_queue_length", {},
                              [](double v) { return v >= kClients - 4; }),
            kClients - 4);
  EXPECT_EQ(ScrapeRole(c.router_process())
                .Get("pdserve_admission_limit")
                .value_or(-1),
            4);

  TempDir dir;
  std::vector<std::string> again = decode_flags;
  again.push_back(absl::StrCat("--port=", port));
  auto restarted = StartRole({"decode", again}, "decode0-again", dir.path());
  if (!restarted.ok()) {
    clients.join();
    FAIL() << restarted.status();
  }
  clients.join();
  ExpectEveryOneServedExactly(outcomes, cases);
  auto d = c.Status(**restarted);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->requests_rejected(), 0) << "the restarted worker was flooded";
  EXPECT_EQ(d->requests_completed(), kClients);
  (*restarted)->proc.Stop(absl::Seconds(10));
}

// Workers whose KV pools differ in size: a request larger than one worker's
// whole pool goes to one that holds it, exactly; a prompt larger than the
// prefill worker's pool is prefilled by the decode worker; one that no
// worker holds fails OUT_OF_RANGE saying what to change (not
// RESOURCE_EXHAUSTED, which a client retries in vain: HTTP 429). The router
// knows each pool's size from the workers' status, so none of this costs a
// worker call that fails (a worker would refuse with OUT_OF_RANGE too), nor
// a prefill whose KV no decode worker could take.
// A decode worker takes a pushed prompt's blocks and grows the rest on
// demand, as colocated mode does: requests that each fit its pool are
// served exactly however many arrive at once, not refused for blocks their
// max_tokens might use later (until 2026-12-06 a push reserved prompt +
// max_tokens: here the third of five pushes arriving together was refused).
TEST(Admission, PushesBeyondADecodeWorkersFreeKvAreServedNotRefused) {
  ClusterOptions o;
  o.common_flags = {"--metrics_port=-1"};
  // 12 blocks of 16 tokens (stories260K's f32 KV is 20 KiB a block); the
  // reference requests need 5, 5 and 9 by their end, 1 for their prompts.
  o.decode_flags = {"--kv_cache_memory=240KiB"};
  // While the prefill worker holds the first prompt, the others queue and
  // then go through one pass: their pushes begin together.
  o.prefill_flags = {"--testonly_prefill_delay_ms=300"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  auto d = c.Status(c.decode(0));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->total_kv_blocks(), 12);
  const auto cases = LoadReferenceCases();
  ASSERT_EQ(cases.size(), 3u);

  constexpr int kClients = 6;
  const std::vector<Outcome> outcomes = Burst(c, cases, kClients);
  ExpectEveryOneServedExactly(outcomes, cases);
  ASSERT_TRUE(c.WaitForNoKvInUse(absl::Seconds(20)).ok()) << c.Logs();
  auto after = c.Status(c.decode(0));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->kv_pushes_received(), kClients);
  EXPECT_EQ(after->kv_pushes_failed(), 0);
  // Whether the sequences overlapped enough to preempt depends on timing.
  std::printf("decode worker: %.0f preemptions\n",
              ScrapeRole(c.decode(0))
                  .Get("pdserve_decode_preemptions_total")
                  .value_or(-1));
}

TEST(Admission, ARequestLargerThanAWorkersKvPoolGoesToOneThatHoldsIt) {
  ClusterOptions o;
  o.decode = 2;
  o.common_flags = {"--metrics_port=-1"};
  // stories260K's f32 KV is 20 KiB per block of 16 tokens.
  o.prefill_flags = {"--kv_cache_memory=60KiB"};        // 3 blocks
  o.decode_flags_of[0] = {"--kv_cache_memory=120KiB"};  // 6 blocks
  o.decode_flags_of[1] = {"--kv_cache_memory=480KiB"};  // 24 blocks
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  {
    auto p = c.Status(c.prefill(0));
    auto d0 = c.Status(c.decode(0));
    auto d1 = c.Status(c.decode(1));
    ASSERT_TRUE(p.ok() && d0.ok() && d1.ok());
    ASSERT_EQ(p->total_kv_blocks(), 3);
    ASSERT_EQ(d0->total_kv_blocks(), 6);
    ASSERT_EQ(d1->total_kv_blocks(), 24);
    ASSERT_EQ(d1->kv_block_size(), 16);
  }
  // 10 prompt + 119 new tokens: 9 blocks, only decode worker 1 holds them
  // (two at once). Two requests at once would go to both decode workers
  // (the router spreads by load) if it did not know decode worker 0's size.
  const ReferenceCase ref = LoadReferenceCases()[2];
  ASSERT_EQ(ref.prompt_ids.size() + ref.max_new_tokens, 129u);
  for (int round = 0; round < 2; ++round) {
    std::vector<absl::StatusOr<GenerateResult>> results(
        2, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        results[i] = RunGenerate(c.router(),
                                 IdsRequest(ref.prompt_ids, ref.max_new_tokens),
                                 absl::Seconds(60));
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& r : results) {
      ASSERT_TRUE(r.ok()) << r.status() << c.Logs();
      EXPECT_EQ(r->output_ids, ref.output_ids);
      EXPECT_EQ(r->timings.prefill_location(), "prefill_worker");
    }
  }
  auto d0 = c.Status(c.decode(0));
  ASSERT_TRUE(d0.ok()) << d0.status();
  EXPECT_EQ(d0->kv_pushes_received(), 0);
  EXPECT_EQ(d0->kv_pushes_failed(), 0);

  // A 60-token prompt (4 blocks) is more than the prefill worker holds: the
  // decode worker that holds the whole request prefills it, and continues
  // the reference exactly.
  constexpr int kGiven = 50;
  std::vector<int32_t> longer = ref.prompt_ids;
  longer.insert(longer.end(), ref.output_ids.begin(),
                ref.output_ids.begin() + kGiven);
  auto fallback =
      RunGenerate(c.router(), IdsRequest(longer, ref.max_new_tokens - kGiven),
                  absl::Seconds(60));
  ASSERT_TRUE(fallback.ok()) << fallback.status() << c.Logs();
  EXPECT_EQ(fallback->output_ids,
            std::vector<int32_t>(ref.output_ids.begin() + kGiven,
                                 ref.output_ids.end()));
  EXPECT_EQ(fallback->timings.prefill_location(), "decode_worker");
  EXPECT_EQ(fallback->timings.prefill_decision().reason(),
            "prompt_exceeds_prefill_pool");

  // 10 + 400 tokens: 26 blocks, more than any worker holds. The prefill
  // worker, which holds the prompt, computes nothing for it.
  auto p_before = c.Status(c.prefill(0));
  ASSERT_TRUE(p_before.ok()) << p_before.status();
  auto none = RunGenerate(c.router(), IdsRequest(ref.prompt_ids, 400),
                          absl::Seconds(60));
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsOutOfRange(none.status())) << none.status();
  const std::string message(none.status().message());
  EXPECT_NE(message.find("needs 26 KV blocks (410 tokens), the largest healthy "
                         "decode worker's whole KV pool has 24 (384 tokens)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--kv_cache_memory"), std::string::npos) << message;
  auto p_after = c.Status(c.prefill(0));
  ASSERT_TRUE(p_after.ok()) << p_after.status();
  EXPECT_EQ(p_after->prefill_tokens_computed(),
            p_before->prefill_tokens_computed());
  // No worker call failed for size along the way: none was retried.
  metrics::PrometheusSamples m = ScrapeRole(c.router_process());
  EXPECT_EQ(m.Get("pdserve_request_retries_total").value_or(-1), 0);
  ASSERT_TRUE(c.WaitForNoKvInUse(absl::Seconds(20)).ok()) << c.Logs();
  // Every worker warned at start that its pool is below the context (512).
  for (RoleProcess* w : {&c.prefill(0), &c.decode(0), &c.decode(1)}) {
    EXPECT_NE(
        ReadFile(w->log_path).find("less than the model's context of 512"),
        std::string::npos)
        << w->name;
  }
}

}  // namespace
}  // namespace pdserve::testing
