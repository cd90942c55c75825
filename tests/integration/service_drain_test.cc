// A router stopping (SIGTERM) with streams still running past its
// --drain_timeout_seconds: every client gets a status it can act on (gRPC
// UNAVAILABLE; an HTTP stream's error event, [DONE] and a complete chunked
// body) instead of a cut connection, the workers free the requests' KV, and
// the router exits 0 within the drain timeout plus a short grace.
#include <sys/wait.h>

#include <atomic>
#include <csignal>
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
  absl::StatusOr<HttpReply> http_reply = absl::UnknownError("not run");
  std::thread http_client([&] {
    const std::string body = json{
        {"prompt", "Once upon a time"},
        {"max_tokens", 300},
        {"ignore_eos", true},
        {"stream", true}}.dump();
    auto conn = RawHttpConnection::Connect(c.router_process().http_port);
    if (!conn.ok()) {
      http_reply = conn.status();
      return;
    }
    absl::Status sent = conn->SendBytes(
        absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Type: application/json\r\nContent-Length: ",
                     body.size(), "\r\n\r\n", body));
    if (!sent.ok()) {
      http_reply = sent;
      return;
    }
    http_reply = conn->ReadReply(absl::Seconds(60));
  });
  // Both streams are running (they started together; the HTTP one is at
  // least as far along a few tokens later).
  const absl::Time wait_until = absl::Now() + absl::Seconds(30);
  while (grpc_tokens.load() < 3 && absl::Now() < wait_until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GE(grpc_tokens.load(), 3) << c.Logs();
  absl::SleepFor(absl::Milliseconds(200));
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

  ASSERT_TRUE(http_reply.ok())
      << "the HTTP stream was cut: " << http_reply.status();
  EXPECT_EQ(http_reply->status, 200);
  auto events = ParseSseEvents(http_reply->body);
  ASSERT_TRUE(events.ok()) << events.status() << "\n" << http_reply->body;
  ASSERT_GE(events->size(), 3u) << http_reply->body;
  EXPECT_EQ(events->back(), "[DONE]");
  const json error = json::parse((*events)[events->size() - 2], nullptr,
                                 /*allow_exceptions=*/false);
  ASSERT_TRUE(error.contains("error")) << http_reply->body;
  EXPECT_EQ(error["error"]["type"], "server_error");
  EXPECT_THAT(error["error"]["message"].get<std::string>(),
              HasSubstr("drain timeout"));
  // Tokens came before the error: it ended a stream, not a request.
  const json first = json::parse(events->front(), nullptr, false);
  EXPECT_TRUE(first.contains("choices")) << events->front();

  // The router stopped its workers' sequences before it exited.
  absl::Status freed = c.WaitForNoKvInUse(absl::Seconds(10));
  EXPECT_TRUE(freed.ok()) << freed;
}

}  // namespace
}  // namespace pdserve::testing
