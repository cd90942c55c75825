// Bad input and cancellation: every invalid request gets INVALID_ARGUMENT
// with a message; fuzzed requests (random bytes, random field values) are all
// answered without crashing anything; 200 requests cancelled at random
// moments leave no KV block in use and the cluster keeps serving.
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

class InputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions o;
    o.prefill = 2;
    o.decode = 2;
    o.decode_flags = {"--kv_lease_seconds=2"};
    auto c = Cluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static absl::Status Call(const v1::GenerateRequest& req) {
    auto r = RunGenerate(cluster_->router(), req, absl::Seconds(30));
    return r.status();
  }
  static void ExpectClusterHealthy() {
    for (int i = 0; i < cluster_->num_prefill(); ++i) {
      EXPECT_FALSE(cluster_->prefill(i).proc.Poll().has_value())
          << "prefill crashed\n"
          << cluster_->Logs();
    }
    for (int i = 0; i < cluster_->num_decode(); ++i) {
      EXPECT_FALSE(cluster_->decode(i).proc.Poll().has_value())
          << "decode crashed\n"
          << cluster_->Logs();
    }
    EXPECT_FALSE(cluster_->router_process().proc.Poll().has_value())
        << "router crashed\n"
        << cluster_->Logs();
    const ReferenceCase ref = LoadReferenceCases()[2];
    auto r = RunGenerate(cluster_->router(),
                         IdsRequest(ref.prompt_ids, ref.max_new_tokens),
                         absl::Seconds(30));
    ASSERT_TRUE(r.ok()) << r.status() << cluster_->Logs();
    EXPECT_EQ(r->output_ids, ref.output_ids);
    absl::Status kv = cluster_->WaitForNoKvInUse(absl::Seconds(15));
    EXPECT_TRUE(kv.ok()) << kv;
  }
  static Cluster* cluster_;
};
Cluster* InputTest::cluster_ = nullptr;

TEST_F(InputTest, InvalidRequestsAreInvalidArgumentWithAMessage) {
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest*)> edit;
    std::string message;  // a substring of the error message
  };
  const std::vector<int32_t> ids = {1, 291, 376};
  std::vector<Case> cases = {
      {"no input", [](auto* r) { r->clear_input(); }, "empty prompt"},
      {"empty text without special tokens",
       [](auto* r) {
         r->set_text("");
         r->set_add_special_tokens(false);
       },
       "empty prompt"},
      {"empty ids", [](auto* r) { r->mutable_token_ids()->clear_ids(); },
       "empty prompt"},
      {"id beyond vocab", [](auto* r) { r->mutable_token_ids()->add_ids(512); },
       "outside the vocabulary"},
      {"negative id", [](auto* r) { r->mutable_token_ids()->add_ids(-1); },
       "outside the vocabulary"},
      {"max_tokens 0", [](auto* r) { r->set_max_tokens(0); }, "max_tokens"},
      {"max_tokens above the cap and the context",
       [](auto* r) { r->set_max_tokens(100000); },
       "maximum context length is 512 tokens"},
      {"beyond context", [](auto* r) { r->set_max_tokens(510); }, "context"},
      {"temperature < 0",
       [](auto* r) { r->mutable_sampling()->set_temperature(-0.5f); },
       "temperature"},
      {"temperature NaN",
       [](auto* r) { r->mutable_sampling()->set_temperature(std::nanf("")); },
       "temperature"},
      {"top_p 0", [](auto* r) { r->mutable_sampling()->set_top_p(0.0f); },
       "top_p"},
      {"top_p > 1", [](auto* r) { r->mutable_sampling()->set_top_p(1.5f); },
       "top_p"},
      {"top_k < 0", [](auto* r) { r->mutable_sampling()->set_top_k(-1); },
       "top_k"},
      {"unknown stop token", [](auto* r) { r->add_stop_token_ids(512); },
       "stop token"},
      {"negative stop token", [](auto* r) { r->add_stop_token_ids(-7); },
       "stop token"},
      {"too many stop strings",
       [](auto* r) {
         for (int i = 0; i < 17; ++i) r->add_stop(absl::StrCat("s", i));
       },
       "stop strings"},
      {"oversized request",
       [](auto* r) { r->set_text(std::string(1536 * 1024, 'a')); }, "bytes"},
      {"top_logprobs too large", [](auto* r) { r->set_top_logprobs(1000); },
       "top_logprobs"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req = IdsRequest(ids, 8);
    c.edit(&req);
    absl::Status s = Call(req);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.name << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), c.message))
        << c.name << ": " << s;
  }
  ExpectClusterHealthy();
}

// A prefill worker called directly (as a router of another build might)
// refuses what it cannot serve, and serves a prompt-only request, which has
// no decode worker to push to.
TEST_F(InputTest, PrefillWorkerRefusesARequestWithNowhereToPushItsKv) {
  auto channel = grpc::CreateChannel(cluster_->prefill(0).address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = pb::Prefill::NewStub(channel);
  const auto call = [&](int max_tokens, bool scored, pb::PrefillResponse* r) {
    pb::PrefillRequest req;
    pb::SequenceSpec& spec = *req.mutable_seq();
    spec.set_request_id(absl::StrCat("direct-", max_tokens, "-", scored));
    for (int32_t id : {1, 291, 376, 263}) spec.add_prompt_ids(id);
    spec.mutable_stop()->set_max_tokens(max_tokens);
    if (scored) spec.set_prompt_logprobs(0);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    return FromGrpcStatus(stub->Prefill(&ctx, req, r));
  };
  pb::PrefillResponse resp;
  absl::Status s = call(8, false, &resp);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "decode_target")) << s;
  s = call(0, true, &resp);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(resp.finished());
  EXPECT_EQ(resp.finish_reason(), "length");
  EXPECT_FALSE(resp.has_first_token());
  EXPECT_EQ(resp.prompt_logprobs_size(), 3);
  ExpectClusterHealthy();
}

// Sends `bytes` as the serialized request of Generation/Generate.
grpc::Status RawGenerate(grpc::Channel* channel, const std::string& bytes) {
  std::shared_ptr<grpc::Channel> alias(std::shared_ptr<grpc::Channel>(),
                                       channel);
  grpc::GenericStub stub(alias);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto call = stub.PrepareCall(&ctx, "/pdserve.v1.Generation/Generate", &cq);
  void* tag;
  bool ok;
  auto wait = [&] { return cq.Next(&tag, &ok) && ok; };
  call->StartCall(reinterpret_cast<void*>(1));
  bool alive = wait();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  if (alive) {
    call->Write(buffer, reinterpret_cast<void*>(2));
    alive = wait();
  }
  if (alive) {
    call->WritesDone(reinterpret_cast<void*>(3));
    alive = wait();
  }
  while (alive) {
    grpc::ByteBuffer response;
    call->Read(&response, reinterpret_cast<void*>(4));
    alive = wait();
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

TEST_F(InputTest, FuzzedRequestsAreAllAnswered) {
  std::mt19937_64 rng(20261130);
  auto channel = MakeChannel(cluster_->router_process().address(),
                             grpc::InsecureChannelCredentials());
  // Random bytes as a serialized GenerateRequest.
  for (int i = 0; i < 200; ++i) {
    std::string bytes(rng() % 64, '\0');
    for (char& ch : bytes) ch = static_cast<char>(rng());
    grpc::Status s = RawGenerate(channel.get(), bytes);
    EXPECT_NE(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << "call " << i;
    EXPECT_NE(s.error_code(), grpc::StatusCode::UNAVAILABLE)
        << s.error_message();
  }
  // Random field values.
  const float floats[] = {
      -1.0f,        0.0f, 0.3f,  0.9f,
      1.0f,         2.0f, 1e30f, std::numeric_limits<float>::infinity(),
      std::nanf("")};
  auto pick_float = [&] { return floats[rng() % std::size(floats)]; };
  int ok = 0;
  for (int i = 0; i < 300; ++i) {
    v1::GenerateRequest req;
    if (rng() % 2) {
      // Valid UTF-8 (proto3 strings must be; invalid bytes are covered by
      // the raw-bytes fuzzing above): letters, controls, multi-byte chars.
      const char* pieces[] = {"a",    "Z", " ",  "\n",   "\t",
                              "\x01", "é", "猫", "🙂", "<s>"};
      std::string text;
      for (int k = rng() % 12; k > 0; --k)
        text += pieces[rng() % std::size(pieces)];
      req.set_text(text);
    } else {
      auto* ids = req.mutable_token_ids();
      for (int k = rng() % 8; k > 0; --k) {
        ids->add_ids(static_cast<int32_t>(rng() % 4 ? rng() % 512 : rng()));
      }
    }
    if (rng() % 4) req.set_max_tokens(static_cast<int32_t>(rng() % 24) - 3);
    auto* s = req.mutable_sampling();
    if (rng() % 2) s->set_temperature(pick_float());
    if (rng() % 2) s->set_top_p(pick_float());
    if (rng() % 2) s->set_top_k(static_cast<int32_t>(rng() % 600) - 50);
    if (rng() % 3 == 0) s->set_min_p(pick_float());
    if (rng() % 3 == 0) s->set_repetition_penalty(pick_float());
    if (rng() % 3 == 0) s->set_presence_penalty(pick_float());
    if (rng() % 3 == 0) s->set_frequency_penalty(pick_float());
    if (rng() % 2) s->set_seed(rng());
    if (rng() % 3 == 0)
      req.set_top_logprobs(static_cast<int32_t>(rng() % 30) - 3);
    if (rng() % 3 == 0) req.set_ignore_eos(rng() % 2);
    for (int k = rng() % 3; k > 0; --k)
      req.add_stop(std::string(1 + rng() % 3, 'a' + rng() % 26));
    for (int k = rng() % 3; k > 0; --k) {
      req.add_stop_token_ids(static_cast<int32_t>(rng() % 600) - 20);
    }
    absl::Status st = Call(req);
    ok += st.ok();
    EXPECT_TRUE(st.ok() || absl::IsInvalidArgument(st))
        << "request " << i << ": " << st;
  }
  EXPECT_GT(ok, 0) << "the fuzzer never produced a valid request";
  ExpectClusterHealthy();
}

TEST_F(InputTest, RandomCancellationsLeaveNoKvInUse) {
  const std::vector<ReferenceCase> refs = LoadReferenceCases();
  std::atomic<int> next{0}, cancelled{0}, completed{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      for (int i; (i = next.fetch_add(1)) < 200;) {
        const ReferenceCase& ref = refs[rng() % refs.size()];
        const int max_tokens =
            rng() % 4 == 0 ? 1 + rng() % 4 : 20 + rng() % 200;
        v1::GenerateRequest req = IdsRequest(ref.prompt_ids, max_tokens);
        req.set_ignore_eos(true);
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
        auto reader = cluster_->router().Generate(&ctx, req);
        // Cancel before the first token, during the transfer or mid-stream.
        const absl::Duration delay = absl::Microseconds(rng() % 30000);
        std::thread canceller([&ctx, delay] {
          absl::SleepFor(delay);
          ctx.TryCancel();
        });
        v1::GenerateResponse msg;
        while (reader->Read(&msg)) {
        }
        grpc::Status s = reader->Finish();
        canceller.join();
        if (s.ok()) {
          completed.fetch_add(1);
        } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
          cancelled.fetch_add(1);
        } else {
          other.fetch_add(1);
          ADD_FAILURE() << "unexpected status " << s.error_code() << ": "
                        << s.error_message();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  std::printf("cancellation: %d cancelled, %d completed, %d other\n",
              cancelled.load(), completed.load(), other.load());
  EXPECT_EQ(cancelled + completed + other, 200);
  EXPECT_GT(cancelled.load(), 50);
  ExpectClusterHealthy();  // includes: 0 KV blocks in use on every P and D
}

}  // namespace
}  // namespace pdserve::testing
