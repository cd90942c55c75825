// Operational hardening (issue 17), with real processes: every listener
// (router gRPC, router HTTP, prefill and decode gRPC, metrics) refuses a port
// another process holds, at once and with the port in the message; a string
// field that is not UTF-8, sent by a raw client, is INVALID_ARGUMENT naming
// the field; and the router's admission queue lets requests beyond
// --max_in_flight wait (FIFO) instead of refusing them, bounded by
// --admission_timeout and by the request's own deadline, with its length
// and waits in the metrics.
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util/grpc_util.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

using ::testing::HasSubstr;

// Starts `role` with `flags` (on top of a fixed --port if given) and expects
// it to exit non-zero within a few seconds, saying which address is taken.
void ExpectTakenPortRefused(const std::string& role,
                            std::vector<std::string> flags,
                            const std::string& port_in_message) {
  SCOPED_TRACE(absl::StrCat(role, " on taken port ", port_in_message));
  TempDir dir;
  std::vector<std::string> argv = {PdserveBinary(), role};
  for (const std::string& f :
       KeepFlagsOf(role, {"--host=127.0.0.1", "--threads=1"})) {
    argv.push_back(f);
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  SubprocessOptions so;
  so.stdout_path = dir.path() + "/log";
  so.stderr_path = so.stdout_path;
  auto proc = Subprocess::Start(argv, so);
  ASSERT_TRUE(proc.ok());
  const absl::Time start = absl::Now();
  auto st = proc->Wait(absl::Seconds(20));
  ASSERT_TRUE(st.ok()) << role << " kept running on a taken port";
  const absl::Duration took = absl::Now() - start;
  std::ifstream in(dir.path() + "/log");
  std::stringstream log;
  log << in.rdbuf();
  EXPECT_FALSE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << log.str();
  EXPECT_THAT(log.str(), HasSubstr(port_in_message));
  EXPECT_THAT(log.str(), ::testing::AnyOf(HasSubstr("already in use"),
                                          HasSubstr("Address in use")));
  std::printf("%s on a taken port: exit after %.0f ms: %s", role.c_str(),
              absl::ToDoubleMilliseconds(took),
              log.str().substr(log.str().find("UNAVAILABLE")).c_str());
}

TEST(HardeningTest, EveryListenerRefusesATakenPort) {
  ClusterOptions o;
  o.common_flags = {"--metrics_port=-1"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const std::string workers =
      absl::StrCat("--decode_workers=", c.decode(0).address(),
                   " --prefill_workers=", c.prefill(0).address());
  // gRPC ports.
  ExpectTakenPortRefused(
      "prefill",
      {absl::StrCat("--port=", c.prefill(0).port), "--metrics_port=0"},
      absl::StrCat(":", c.prefill(0).port));
  ExpectTakenPortRefused(
      "decode", {absl::StrCat("--port=", c.decode(0).port), "--metrics_port=0"},
      absl::StrCat(":", c.decode(0).port));
  ExpectTakenPortRefused(
      "router",
      {absl::StrCat("--port=", c.router_process().port), "--metrics_port=0",
       "--http_port=0",
       absl::StrCat("--decode_workers=", c.decode(0).address()),
       absl::StrCat("--prefill_workers=", c.prefill(0).address())},
      absl::StrCat(":", c.router_process().port));
  // The router's HTTP port.
  ExpectTakenPortRefused(
      "router",
      {"--port=0", "--metrics_port=0",
       absl::StrCat("--http_port=", c.router_process().http_port),
       absl::StrCat("--decode_workers=", c.decode(0).address()),
       absl::StrCat("--prefill_workers=", c.prefill(0).address())},
      absl::StrCat(":", c.router_process().http_port));
  // Metrics ports (a worker's and the router's).
  ExpectTakenPortRefused(
      "decode",
      {"--port=0", absl::StrCat("--metrics_port=", c.decode(0).metrics_port)},
      absl::StrCat(":", c.decode(0).metrics_port));
  ExpectTakenPortRefused(
      "router",
      {"--port=0", "--http_port=0",
       absl::StrCat("--metrics_port=", c.router_process().metrics_port),
       absl::StrCat("--decode_workers=", c.decode(0).address()),
       absl::StrCat("--prefill_workers=", c.prefill(0).address())},
      absl::StrCat(":", c.router_process().metrics_port));
  // The first cluster still serves.
  const ReferenceCase ref = LoadReferenceCases()[0];
  auto r =
      RunGenerate(c.router(), IdsRequest(ref.prompt_ids, 8), absl::Seconds(30));
  EXPECT_TRUE(r.ok()) << r.status();
}

// A request whose `text` (field `field`: 2 of GenerateRequest, 1 of
// TokenizeRequest) holds invalid UTF-8, serialized by hand (a protobuf
// library would refuse to build it).
grpc::ByteBuffer RawRequestWithBadText(int field) {
  const std::string bad = "ok \xff\xfe then more";
  std::string bytes;
  bytes.push_back(static_cast<char>((field << 3) | 2));  // length-delimited
  bytes.push_back(static_cast<char>(bad.size()));
  bytes += bad;
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::Status RawUnaryCall(grpc::Channel* channel, const std::string& method,
                          const grpc::ByteBuffer& request) {
  grpc::GenericStub stub(std::shared_ptr<grpc::Channel>(
      std::shared_ptr<grpc::Channel>(), channel));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || !ok) {
    return grpc::Status(grpc::StatusCode::UNKNOWN, "the call did not complete");
  }
  return status;
}

TEST(HardeningTest, InvalidUtf8FromARawClientIsInvalidArgumentNamingTheField) {
  ClusterOptions o;
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto channel = MakeChannel((*cluster)->router_process().address(),
                             grpc::InsecureChannelCredentials());
  for (const auto& [method, field] :
       {std::pair{"/pdserve.v1.Generation/Generate", 2},
        std::pair{"/pdserve.v1.Generation/Tokenize", 1}}) {
    SCOPED_TRACE(method);
    const grpc::Status s =
        RawUnaryCall(channel.get(), method, RawRequestWithBadText(field));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("field 'text' is not valid UTF-8"));
    EXPECT_THAT(s.error_message(), HasSubstr("byte 3"));
  }
  // Garbage that is no protobuf at all.
  grpc::Slice junk(std::string("\xff\xff\xff\xff", 4));
  const grpc::Status s =
      RawUnaryCall(channel.get(), "/pdserve.v1.Generation/Tokenize",
                   grpc::ByteBuffer(&junk, 1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("not a valid"));
}

// Sends `n` requests of `tokens` output tokens at once; returns their
// results in order.
std::vector<absl::StatusOr<GenerateResult>> Burst(v1::Generation::Stub& stub,
                                                  int n, int tokens,
                                                  absl::Duration timeout) {
  std::vector<absl::StatusOr<GenerateResult>> out(
      n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  const ReferenceCase ref = LoadReferenceCases()[0];
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest req = IdsRequest(ref.prompt_ids, tokens);
      req.set_ignore_eos(true);
      out[i] = RunGenerate(stub, req, timeout);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(HardeningTest, RequestsBeyondTheInFlightCapWaitInTheAdmissionQueue) {
  ClusterOptions o;
  o.common_flags = {"--metrics_port=-1"};
  o.router_flags = {"--max_in_flight=2", "--admission_queue=64",
                    "--admission_timeout=60s"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  auto results = Burst(c.router(), 24, 40, absl::Seconds(120));
  const std::vector<int32_t> expected = LoadReferenceCases()[0].output_ids;
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->usage.completion_tokens(), 40);
  }
  metrics::PrometheusSamples m = ScrapeRole(c.router_process());
  // 22 of 24 had to wait (2 ran at once); all were admitted, none refused.
  EXPECT_GE(m.Get("pdserve_admission_wait_seconds_count").value_or(0), 20);
  EXPECT_EQ(m.Get("pdserve_admission_queue_length").value_or(-1), 0);
  EXPECT_EQ(m.Get("pdserve_requests_total", {{"code", "OK"}}).value_or(0), 24);
  EXPECT_EQ(m.Get("pdserve_requests_total", {{"code", "RESOURCE_EXHAUSTED"}})
                .value_or(-1),
            0);
}

TEST(HardeningTest, AdmissionWaitIsBoundedByTimeoutAndDeadline) {
  ClusterOptions o;
  o.common_flags = {"--metrics_port=-1"};
  o.router_flags = {"--max_in_flight=1", "--admission_queue=8",
                    "--admission_timeout=300ms", "--retry_after_ms=250"};
  // Every prefill takes 3 s: the first request holds the only slot.
  o.prefill_flags = {"--testonly_prefill_delay_ms=3000"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  // One long request holds the only slot.
  std::thread holder([&] {
    const ReferenceCase ref = LoadReferenceCases()[0];
    v1::GenerateRequest req = IdsRequest(ref.prompt_ids, 400);
    req.set_ignore_eos(true);
    (void)RunGenerate(c.router(), req, absl::Seconds(120));
  });
  absl::SleepFor(absl::Milliseconds(300));
  // Waits 300 ms, then RESOURCE_EXHAUSTED saying so.
  auto timed_out =
      RunGenerate(c.router(), IdsRequest({1, 2, 3}, 4), absl::Seconds(30));
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(timed_out.status().message()),
              HasSubstr("--admission_timeout"));
  // A deadline shorter than the admission timeout ends the wait first.
  auto deadline = RunGenerate(c.router(), IdsRequest({1, 2, 3}, 4),
                              absl::Milliseconds(100));
  ASSERT_FALSE(deadline.ok());
  EXPECT_EQ(deadline.status().code(), absl::StatusCode::kDeadlineExceeded);
  holder.join();
  metrics::PrometheusSamples m = ScrapeRole(c.router_process());
  EXPECT_EQ(m.Get("pdserve_admission_queue_length").value_or(-1), 0);
  EXPECT_GE(m.Get("pdserve_admission_wait_seconds_count").value_or(0), 2);
  EXPECT_TRUE(c.WaitForNoKvInUse(absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace pdserve::testing
