// What --kv_transport builds. KvSendTransports is the prefill worker's
// sender stack: UCX, falling back to gRPC, as the mode allows (gRPC always
// carries the control stream). KvReceiveTransports is the decode worker's
// side: whether its KvTransferService accepts and advertises UCX. Each owns the
// UCX worker it uses; in auto mode a UCX that cannot start is logged and left
// out. Thread-safe once built.
#ifndef PDSERVE_COMMON_TRANSPORT_KV_TRANSPORTS_H_
#define PDSERVE_COMMON_TRANSPORT_KV_TRANSPORTS_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_transport_mode.h"
#include "common/transport/ucx_kv_receiver.h"
#include "common/transport/ucx_kv_sender.h"
#include "common/transport/ucx_worker.h"
#include "grpcpp/security/credentials.h"

namespace pdserve::transport {

// What a worker's UCX transport holds now (zeros without UCX).
struct UcxStats {
  int64_t endpoints = 0;
  int64_t registered_bytes = 0;
  int64_t transfers = 0;        // pushes holding a region / landing buffer
  int64_t mapped_buffers = 0;   // decode: P's export buffers mapped here
  int64_t operations = 0;       // sends / receives in flight
  int64_t endpoint_errors = 0;  // cumulative
};

// Sets the kv_ucx_* fields of a worker's Status answer.
void FillUcxStatus(const UcxStats& stats, pb::WorkerStatusResponse* r);

class KvSendTransports {
 public:
  static absl::StatusOr<std::unique_ptr<KvSendTransports>> Create(
      KvTransportMode mode, std::shared_ptr<grpc::ChannelCredentials> creds,
      KvFaultInjection faults = {});
  ~KvSendTransports();

  // Where pushes go.
  KvSender* sender() const { return sender_; }
  GrpcKvSender* grpc() const { return grpc_.get(); }
  UcxKvSender* ucx() const { return ucx_.get(); }  // null: no UCX
  UcxWorker* ucx_worker() const { return worker_.get(); }
  UcxStats ucx_stats() const;

 private:
  KvSendTransports() = default;
  std::unique_ptr<GrpcKvSender> grpc_;
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<UcxKvSender> ucx_;
  KvSender* sender_ = nullptr;
};

class KvReceiveTransports {
 public:
  // `max_chunk_bytes`: the largest chunk a push can have (ChunkTokenRanges).
  static absl::StatusOr<std::unique_ptr<KvReceiveTransports>> Create(
      KvTransportMode mode, int64_t max_chunk_bytes);
  ~KvReceiveTransports();

  KvReceiveOptions options() const;
  UcxWorker* ucx_worker() const { return worker_.get(); }  // null: no UCX
  UcxKvReceiver* ucx() const { return ucx_.get(); }
  UcxStats ucx_stats() const;

 private:
  KvReceiveTransports() = default;
  KvTransportMode mode_ = KvTransportMode::kAuto;
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<UcxKvReceiver> ucx_;
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_KV_TRANSPORTS_H_
