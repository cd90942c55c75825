// KV transport over gRPC: GrpcKvSender pushes with KvTransfer.Push
// (client-streaming, P -> D) over cached channels; KvTransferService is the
// decode worker's receiving service, verifying every chunk before handing it
// to a KvSink. Both are thread-safe.
#ifndef PDSERVE_COMMON_TRANSPORT_GRPC_KV_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_GRPC_KV_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/kv_transport.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "pdserve/v1/worker.grpc.pb.h"

namespace pdserve::transport {

class GrpcKvSender : public KvSender {
 public:
  GrpcKvSender(std::shared_ptr<grpc::ChannelCredentials> creds,
               KvFaultInjection faults = {});
  absl::StatusOr<std::unique_ptr<KvPushStream>> Open(
      const std::string& target, const pb::KvHeader& header,
      absl::Time deadline) override;

 private:
  std::shared_ptr<grpc::Channel> ChannelFor(const std::string& target);

  const std::shared_ptr<grpc::ChannelCredentials> creds_;
  const KvFaultInjection faults_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
};

// Counters of the receiving side, readable at any time.
struct KvReceiveCounters {
  std::atomic<int64_t> pushes{0};
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> checksum_failures{0};
  std::atomic<int64_t> refused{0};
};

class KvTransferService final : public pb::KvTransfer::Service {
 public:
  // `factory` must outlive the service.
  explicit KvTransferService(KvSinkFactory* factory) : factory_(factory) {}
  grpc::Status Push(grpc::ServerContext* context,
                    grpc::ServerReader<pb::KvPushMessage>* reader,
                    pb::KvPushAck* ack) override;
  const KvReceiveCounters& counters() const { return counters_; }

 private:
  KvSinkFactory* const factory_;
  KvReceiveCounters counters_;
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_GRPC_KV_TRANSPORT_H_
