// A router stopping (SIGTERM) with streams still running past its
// --drain_timeout_seconds: every client gets a status it can act on (gRPC
// UNAVAILABLE; an HTTP stream's error event, [DONE] and the chunked body's
// end) instead of a cut connection, the workers free the requests' KV, and
// the router exits 0 within the drain timeout plus a short grace.
#include <sys/wait.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util/grpc_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/http_test_client.h"

namespace pdserve::testing {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

TEST(DrainTest, StreamsPastTheRoutersDrainTimeoutEndWithAStatus) {
  ClusterOptions o;
  o.prefill = 1;
  o.decode = 1;
  // 300 tokens at 40 ms each: 12 s, far past the router's 1 s drain.
  o.decode_flags = {"--testonly_stream_delay_ms=40"};
  o.router_flags = {"--drain_timeout_seconds=1"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const ReferenceCase ref = LoadReferenceCases()[0];

  std::atomic<int> grpc_tokens{0};
  absl::Status grpc_status;
  std::thread grpc_client([&] {
    v1::GenerateRequest req = IdsRequest(ref.prompt_ids, 300);
    req.set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = c.router().Generate(&ctx, req);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) grpc_tokens.fetch_add(msg.tokens_size());
    grpc_status = FromGrpcStatus(reader->Finish());
  });
  // The HTTP stream's raw bytes, read to the server's close.
  std::atomic<bool> http_streaming{false};
  absl::Status http_status;
  std::string http_raw;
  std::thread http_client([&] {
    const std::string body = json{
        {"prompt", "Once upon a time"},
        {"max_tokens", 300},
        {"ignore_eos", true},
        {"stream", true}}.dump();
    auto conn = RawHttpConnection::Connect(c.router_process().http_port);
    if (!conn.ok()) {
      http_status = conn.status();
      return;
    }
    http_status = conn->SendBytes(
        absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Type: application/json\r\nContent-Length: ",
                     body.size(), "\r\n\r\n", body));
    while (http_status.ok()) {
      auto got = conn->ReadSome(1 << 16, absl::Seconds(60));
      if (!got.ok()) {
        http_status = got.status();
      } else if (got->empty()) {
        break;  // the server closed the connection
      } else {
        http_raw += *got;
        if (absl::StrContains(http_raw, "data: {")) http_streaming = true;
      }
    }
  });
  // Both streams are running.
  const absl::Time wait_until = absl::Now() + absl::Seconds(30);
  while ((grpc_tokens.load() < 3 || !http_streaming.load()) &&
         absl::Now() < wait_until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GE(grpc_tokens.load(), 3) << c.Logs();
  ASSERT_TRUE(http_streaming.load()) << http_raw << c.Logs();
  const absl::Time signalled = absl::Now();
  c.router_process().proc.Signal(SIGTERM);
  grpc_client.join();
  http_client.join();
  auto exited = c.router_process().proc.Wait(absl::Seconds(20));
  const absl::Duration took = absl::Now() - signalled;
  ASSERT_TRUE(exited.ok()) << "the router did not exit";
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0)
      << DescribeWaitStatus(*exited);
  EXPECT_LT(took, absl::Seconds(10)) << "drain 1 s + grace 2 s + shutdown";
  std::printf("router exited %.2f s after SIGTERM; gRPC stream: %d tokens\n",
              absl::ToDoubleSeconds(took), grpc_tokens.load());

  EXPECT_EQ(grpc_status.code(), absl::StatusCode::kUnavailable) << grpc_status;
  EXPECT_THAT(std::string(grpc_status.message()), HasSubstr("drain timeout"));
  EXPECT_LT(grpc_tokens.load(), 300);

  // A whole chunked stream: tokens, the error event, [DONE], the last chunk.
  ASSERT_TRUE(http_status.ok()) << http_status;
  EXPECT_TRUE(absl::StartsWith(http_raw, "HTTP/1.1 200")) << http_raw;
  const size_t error_at = http_raw.find("data: {\"error\"");
  const size_t done_at = http_raw.find("data: [DONE]");
  ASSERT_NE(error_at, std::string::npos) << "no error event:\n" << http_raw;
  EXPECT_LT(http_raw.find("data: {"), error_at) << "no token before it";
  EXPECT_NE(http_raw.find("drain timeout", error_at), std::string::npos);
  EXPECT_NE(http_raw.find("server_error", error_at), std::string::npos);
  EXPECT_GT(done_at, error_at);
  EXPECT_NE(done_at, std::string::npos);
  EXPECT_TRUE(absl::EndsWith(http_raw, "\r\n0\r\n\r\n"))
      << "the chunked body was cut:\n"
      << http_raw.substr(http_raw.size() > 300 ? http_raw.size() - 300 : 0);

  // The operator's log counts each request once: the HTTP stream is one
  // generation and one HTTP request, not two requests.
  std::ifstream log_file(c.router_process().log_path);
  std::stringstream router_log;
  router_log << log_file.rdbuf();
  EXPECT_THAT(router_log.str(),
              HasSubstr("drain timeout: 2 generations (gRPC and HTTP), 1 "
                        "HTTP requests still in flight; ending them with "
                        "UNAVAILABLE"))
      << router_log.str();

  // The router stopped its workers' sequences before it exited.
  absl::Status freed = c.WaitForNoKvInUse(absl::Seconds(10));
  EXPECT_TRUE(freed.ok()) << freed;
}

}  // namespace
}  // namespace pdserve::testing
