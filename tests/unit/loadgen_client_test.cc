// The bench's gRPC client and run loop against an in-process fake router
// whose streams are known: token counts, usage, stage timings, injected
// UNAVAILABLE failures, and the concurrency cap seen by the server.
#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "gtest/gtest.h"
#include "pdserve/v1/generate.grpc.pb.h"
#include "tools/loadgen/client.h"
#include "tools/loadgen/runner.h"
#include "tools/loadgen/stats.h"

namespace pdserve::loadgen {
namespace {

// A Generation service that streams `max_tokens` tokens, one per message,
// 1 ms apart, and fails a prompt whose text is "fail" after one token.
// Thread-safe (counters are atomics or under a mutex).
class FakeRouter final : public pdserve::v1::Generation::Service {
 public:
  grpc::Status GetModelInfo(grpc::ServerContext*,
                            const pdserve::v1::GetModelInfoRequest*,
                            pdserve::v1::GetModelInfoResponse* resp) override {
    resp->set_model("fake");
    resp->set_vocab_size(512);
    resp->set_max_context(512);
    resp->set_mode("disaggregated");
    return grpc::Status::OK;
  }

  grpc::Status Generate(
      grpc::ServerContext*, const pdserve::v1::GenerateRequest* req,
      grpc::ServerWriter<pdserve::v1::GenerateResponse>* writer) override {
    const int now = ++in_flight_;
    int seen = max_in_flight_.load();
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
    {
      absl::MutexLock lock(&mu_);
      ignore_eos_.push_back(req->has_ignore_eos() && req->ignore_eos());
      temperature_set_.push_back(req->sampling().has_temperature());
    }
    grpc::Status status = Stream(*req, writer);
    --in_flight_;
    return status;
  }

  int max_in_flight() const { return max_in_flight_.load(); }
  std::vector<bool> ignore_eos() {
    absl::MutexLock lock(&mu_);
    return ignore_eos_;
  }
  std::vector<bool> temperature_set() {
    absl::MutexLock lock(&mu_);
    return temperature_set_;
  }

 private:
  grpc::Status Stream(
      const pdserve::v1::GenerateRequest& req,
      grpc::ServerWriter<pdserve::v1::GenerateResponse>* writer) {
    const bool fail = req.has_text() && req.text() == "fail";
    const int n = req.max_tokens();
    const int prompt_len = req.has_token_ids()
                               ? req.token_ids().ids_size()
                               : static_cast<int>(req.text().size());
    for (int i = 0; i < n; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
      pdserve::v1::GenerateResponse resp;
      resp.set_request_id(req.request_id());
      resp.add_tokens()->set_id(100 + i);
      if (fail) {
        writer->Write(resp);
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "decode worker died");
      }
      if (i == n - 1) {
        resp.set_finished(true);
        resp.set_finish_reason("length");
        resp.mutable_usage()->set_prompt_tokens(prompt_len);
        resp.mutable_usage()->set_completion_tokens(n);
        resp.mutable_timings()->set_prefill_compute(0.25);
        resp.mutable_timings()->set_kv_transfer(0.125);
      }
      writer->Write(resp);
    }
    return grpc::Status::OK;
  }

  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  absl::Mutex mu_;
  std::vector<bool> ignore_eos_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> temperature_set_ ABSL_GUARDED_BY(mu_);
};

class LoadgenClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions opts;
    opts.address = "127.0.0.1:0";
    opts.services = {&service_};
    auto started = StartServer(opts);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    target_ = absl::StrCat("127.0.0.1:", started->port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  FakeRouter service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

std::vector<BenchRequest> Requests() {
  std::vector<BenchRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    BenchRequest r;
    if (i % 4 == 3) {
      r.prompt_text = "fail";
    } else {
      r.prompt_ids.assign(5 + i, 200);
      r.input_tokens = 5 + i;
    }
    r.max_tokens = 3 + i % 3;
    reqs.push_back(r);
  }
  return reqs;
}

TEST_F(LoadgenClientTest, RecordsStreamsAndErrors) {
  auto client = BenchClient::Connect(target_, 2, absl::Seconds(10));
  ASSERT_TRUE(client.ok()) << client.status();
  auto info = (*client)->GetModelInfo(absl::Seconds(5));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->vocab_size, 512);
  EXPECT_EQ(info->mode, "disaggregated");

  const std::vector<BenchRequest> reqs = Requests();
  RunOptions opts;
  opts.request_rate = std::numeric_limits<double>::infinity();
  opts.max_concurrency = 2;
  opts.progress = false;
  opts.request_template.mutable_sampling()->set_temperature(0);
  opts.request_template.set_ignore_eos(true);
  auto records = RunBenchmark(**client, reqs, opts);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestRecord& r = (*records)[i];
    EXPECT_EQ(r.index, static_cast<int>(i));
    if (reqs[i].prompt_text == "fail") {
      EXPECT_EQ(r.status_code, static_cast<int>(grpc::StatusCode::UNAVAILABLE));
      EXPECT_EQ(r.error_message, "decode worker died");
      EXPECT_EQ(r.output_tokens, 1);
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.error_message;
    EXPECT_EQ(r.output_tokens, reqs[i].max_tokens);
    EXPECT_EQ(static_cast<int>(r.chunks.size()), reqs[i].max_tokens);
    EXPECT_EQ(r.input_tokens, reqs[i].input_tokens);
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_LE(r.sent_s, r.chunks.front().t_s);
    EXPECT_LE(r.chunks.back().t_s, r.end_s);
    const auto stage = std::find_if(
        r.stages.begin(), r.stages.end(),
        [](const StageTiming& s) { return s.stage == "prefill_compute"; });
    ASSERT_NE(stage, r.stages.end());
    EXPECT_EQ(stage->seconds, 0.25);
    // Only the stages the server set (explicit presence) are recorded.
    EXPECT_EQ(r.stages.size(), 2u);
  }
  const BenchMetrics m = ComputeMetrics(*records, RunDuration(*records), {});
  EXPECT_EQ(m.completed, 9);
  EXPECT_EQ(m.failed, 3);
  EXPECT_EQ(m.errors_by_code.at("UNAVAILABLE"), 3);
  int64_t expected_out = 0, expected_in = 0;
  for (const BenchRequest& r : reqs) {
    if (r.prompt_text != "fail") {
      expected_out += r.max_tokens;
      expected_in += r.input_tokens;
    }
  }
  EXPECT_EQ(m.total_output_tokens, expected_out);
  EXPECT_EQ(m.total_input_tokens, expected_in);
  EXPECT_EQ(m.stage_ms.at("kv_transfer").mean, 125.0);
  // The concurrency cap held at the server.
  EXPECT_GE(service_.max_in_flight(), 1);
  EXPECT_LE(service_.max_in_flight(), 2);
  for (bool b : service_.ignore_eos()) EXPECT_TRUE(b);
  for (bool b : service_.temperature_set()) EXPECT_TRUE(b);
}

TEST_F(LoadgenClientTest, UnreachableRouterIsAnError) {
  server_->Shutdown();
  server_.reset();
  auto client = BenchClient::Connect(target_, 1, absl::Milliseconds(300));
  EXPECT_FALSE(client.ok());
}

}  // namespace
}  // namespace pdserve::loadgen
