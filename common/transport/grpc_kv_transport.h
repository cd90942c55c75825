// KV transport over gRPC: GrpcKvSender pushes with KvTransfer.Push
// (client-streaming, P -> D) over cached channels; KvTransferService is the
// decode worker's receiving service, verifying every chunk before handing it
// to a KvSink, for chunks sent inline and for chunks whose bytes come as UCX
// messages (ucx_kv_receiver.h). KvPushCall is one Push call, the control
// channel every sender shares. Senders and the service are thread-safe; a
// KvPushCall is driven by one thread (Cancel: any thread).
#ifndef PDSERVE_COMMON_TRANSPORT_GRPC_KV_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_GRPC_KV_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/kv_transport.h"
#include "common/transport/ucx_kv_receiver.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "pdserve/v1/worker.grpc.pb.h"

namespace pdserve::transport {

// One KvTransfer.Push call, client side.
class KvPushCall {
 public:
  KvPushCall(const std::shared_ptr<grpc::Channel>& channel,
             absl::Time deadline);
  ~KvPushCall();  // cancels and finishes an unfinished call

  // A failed Write ends the call: the error is D's status. Errors stick.
  absl::Status Write(const pb::KvPushMessage& msg);
  // Writes `last` (the commit) and waits for D's acknowledgement.
  absl::StatusOr<pb::KvPushAck> Finish(const pb::KvPushMessage& last);
  // Waits for D to end the call without sending anything more (test stalls).
  absl::Status FinishWithoutCommit();
  void Cancel() { context_.TryCancel(); }

 private:
  absl::Status FinishWithError(absl::Status if_ok);

  std::unique_ptr<pb::KvTransfer::Stub> stub_;
  grpc::ClientContext context_;
  pb::KvPushAck ack_;
  std::unique_ptr<grpc::ClientWriter<pb::KvPushMessage>> writer_;
  absl::Status error_;
  bool finished_ = false;
};

class GrpcKvSender : public KvSender {
 public:
  GrpcKvSender(std::shared_ptr<grpc::ChannelCredentials> creds,
               KvFaultInjection faults = {});
  absl::StatusOr<std::unique_ptr<KvPushStream>> Open(
      const std::string& target, const pb::KvHeader& header,
      absl::Time deadline) override;

  // The cached channel to `target`.
  std::shared_ptr<grpc::Channel> ChannelFor(const std::string& target);
  // KvTransfer.Describe of `target` (at most 10 s; an empty answer from a
  // receiver without Describe).
  absl::StatusOr<pb::KvDescribeResponse> Describe(
      const std::string& target, absl::Time deadline,
      const pb::KvDescribeRequest& request = pb::KvDescribeRequest());
  const KvFaultInjection& faults() const { return faults_; }

 private:
  const std::shared_ptr<grpc::ChannelCredentials> creds_;
  const KvFaultInjection faults_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
};

// Counters of the receiving side, readable at any time.
struct KvReceiveCounters {
  std::atomic<int64_t> pushes{0};
  std::atomic<int64_t> ucx_pushes{0};    // of `pushes`: bytes over UCX
  std::atomic<int64_t> ucx_unusable{0};  // UCX pushes D could not take
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> checksum_failures{0};
  std::atomic<int64_t> refused{0};
};

// What a receiving service accepts besides inline chunks.
struct KvReceiveOptions {
  // Accepts UCX pushes (Describe advertises its worker); null: none. Must
  // outlive the service.
  UcxKvReceiver* ucx = nullptr;
};

class KvTransferService final : public pb::KvTransfer::Service {
 public:
  // `factory` must outlive the service.
  explicit KvTransferService(KvSinkFactory* factory,
                             KvReceiveOptions options = {});
  grpc::Status Push(grpc::ServerContext* context,
                    grpc::ServerReader<pb::KvPushMessage>* reader,
                    pb::KvPushAck* ack) override;
  grpc::Status Describe(grpc::ServerContext* context,
                        const pb::KvDescribeRequest* request,
                        pb::KvDescribeResponse* response) override;
  const KvReceiveCounters& counters() const { return counters_; }

 private:
  // Where the push's chunk references point (null: inline only).
  absl::StatusOr<std::unique_ptr<KvChunkSource>> OpenSource(
      const pb::KvHeader& header);

  KvSinkFactory* const factory_;
  UcxKvReceiver* const ucx_;  // null: no UCX pushes
  KvReceiveCounters counters_;
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_GRPC_KV_TRANSPORT_H_
