#include "tools/loadgen/client.h"

#include <optional>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util/grpc_util.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_callback.h"

namespace pdserve::loadgen {
namespace {

// One streaming Generate call, driven by gRPC's callback API. The reactor
// lives until the run ends (owned by the run's call list); its callbacks run
// on gRPC threads, one at a time for a given call.
class StreamCall
    : public BenchCall,
      public grpc::ClientReadReactor<pdserve::v1::GenerateResponse> {
 public:
  StreamCall(pdserve::v1::Generation::Stub* stub, const BenchRequest& request,
             int32_t index, double scheduled_s, const CallSetup& setup,
             CallObserver* state)
      : stub_(stub),
        recorder_(index, scheduled_s, request.input_tokens, request.is_long),
        state_(state),
        t0_(setup.t0) {
    request_ = setup.request_template;
    request_.set_request_id(absl::StrCat("bench-", index));
    if (!request.prompt_ids.empty()) {
      request_.mutable_token_ids()->mutable_ids()->Assign(
          request.prompt_ids.begin(), request.prompt_ids.end());
    } else {
      request_.set_text(request.prompt_text);
    }
    request_.set_max_tokens(request.max_tokens);
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + setup.request_timeout));
  }

  void Start() override {
    state_->Started();
    recorder_.OnSent(SecondsSince(t0_));
    stub_->async()->Generate(&ctx_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  // Ends the call early (OnDone still runs, with CANCELLED).
  void Cancel() override { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    const double t = SecondsSince(t0_);
    recorder_.OnMessage(t, response_.tokens_size());
    if (response_.finished()) {
      final_message_s_ = t;
      recorder_.OnFinishReason(response_.finish_reason());
      if (response_.has_usage()) {
        recorder_.OnUsage(response_.usage().prompt_tokens(),
                          response_.usage().completion_tokens());
      }
      if (response_.has_timings()) AddStages(response_.timings());
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    const double t = SecondsSince(t0_);
    // A stream that delivered its final message ends there; the trailing
    // status adds nothing to the request's latency.
    const double end = status.ok() && final_message_s_ ? *final_message_s_ : t;
    state_->Finished(recorder_.Finish(end,
                                      static_cast<int32_t>(status.error_code()),
                                      status.error_message()));
  }

 private:
  // Records the stages the server reported (absent = did not happen, e.g.
  // kv_transfer in colocated mode).
  void AddStages(const pdserve::v1::StageTimings& t) {
    using T = pdserve::v1::StageTimings;
    struct Stage {
      const char* name;
      bool (T::*has)() const;
      double (T::*value)() const;
    };
    static constexpr Stage kStages[] = {
        {"router_queue", &T::has_router_queue, &T::router_queue},
        {"prefill_queue", &T::has_prefill_queue, &T::prefill_queue},
        {"prefill_compute", &T::has_prefill_compute, &T::prefill_compute},
        {"kv_transfer", &T::has_kv_transfer, &T::kv_transfer},
        {"kv_transfer_tail", &T::has_kv_transfer_tail, &T::kv_transfer_tail},
        {"decode_admission", &T::has_decode_admission, &T::decode_admission},
        {"first_decode_step", &T::has_first_decode_step, &T::first_decode_step},
        {"decode", &T::has_decode, &T::decode},
        {"server_e2e", &T::has_e2e, &T::e2e}};
    for (const Stage& st : kStages) {
      if ((t.*st.has)()) recorder_.OnStage(st.name, (t.*st.value)());
    }
  }

  pdserve::v1::Generation::Stub* const stub_;
  StreamRecorder recorder_;
  CallObserver* state_;
  std::chrono::steady_clock::time_point t0_;
  grpc::ClientContext ctx_;
  pdserve::v1::GenerateRequest request_;
  pdserve::v1::GenerateResponse response_;
  std::optional<double> final_message_s_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchClient>> BenchClient::Connect(
    const std::string& target, int num_channels, absl::Duration timeout) {
  auto client = absl::WrapUnique(new BenchClient());
  client->target_ = target;
  for (int i = 0; i < std::max(1, num_channels); ++i) {
    grpc::ChannelArguments args;
    // Distinct channels must not share one subchannel (one TCP connection).
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("pdserve.bench_channel", i);
    args.SetMaxReceiveMessageSize(kInternalMaxMessageBytes);
    args.SetMaxSendMessageSize(kInternalMaxMessageBytes);
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        target, grpc::InsecureChannelCredentials(), args);
    client->stubs_.push_back(pdserve::v1::Generation::NewStub(channel));
  }
  absl::StatusOr<ModelInfo> info = client->GetModelInfo(timeout);
  if (!info.ok()) {
    return absl::Status(info.status().code(),
                        absl::StrCat("router ", target, " did not answer: ",
                                     info.status().message(),
                                     " (is a router serving there? `pdserve "
                                     "up` starts a cluster; --target names "
                                     "another)"));
  }
  return client;
}

absl::StatusOr<ModelInfo> BenchClient::GetModelInfo(absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ctx.set_wait_for_ready(true);
  pdserve::v1::GetModelInfoRequest req;
  pdserve::v1::GetModelInfoResponse resp;
  const grpc::Status s = stubs_.front()->GetModelInfo(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  ModelInfo info;
  info.model = resp.model();
  info.mode = resp.mode();
  info.vocab_size = resp.vocab_size();
  info.max_context = resp.max_context();
  info.num_prefill_workers = resp.num_prefill_workers();
  info.num_decode_workers = resp.num_decode_workers();
  return info;
}

std::unique_ptr<BenchCall> BenchClient::NewCall(const BenchRequest& request,
                                                int32_t index,
                                                double scheduled_s,
                                                const CallSetup& setup,
                                                CallObserver* observer) {
  return std::make_unique<StreamCall>(NextStub(), request, index, scheduled_s,
                                      setup, observer);
}

pdserve::v1::Generation::Stub* BenchClient::NextStub() {
  return stubs_[next_.fetch_add(1) % stubs_.size()].get();
}

}  // namespace pdserve::loadgen
