#include "tools/service_cmds/kv_transport_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, kv_transport, "auto",
          "prefill and decode: how KV moves from prefill to decode workers: "
          "auto (UCX when both workers have it, which picks the best of its "
          "transports: RDMA, shared memory, TCP; UCX_TLS and UCX_NET_DEVICES "
          "pin them; else gRPC), ucx (UCX or fail the push), or grpc (bytes "
          "in the gRPC stream). A decode worker accepts UCX unless its own "
          "value is grpc.");

namespace pdserve {

absl::StatusOr<transport::KvTransportMode> KvTransportModeFromFlags() {
  return transport::ParseKvTransportMode(absl::GetFlag(FLAGS_kv_transport));
}

}  // namespace pdserve
