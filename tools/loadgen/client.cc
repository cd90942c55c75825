#include "tools/loadgen/client.h"

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util/grpc_util.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace pdserve::loadgen {

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
                                     info.status().message()));
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

pdserve::v1::Generation::Stub* BenchClient::NextStub() {
  return stubs_[next_.fetch_add(1) % stubs_.size()].get();
}

}  // namespace pdserve::loadgen
