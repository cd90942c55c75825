// --kv_transport: how KV moves from prefill to decode workers (the stacks it
// builds are in kv_transports.h).
#ifndef PDSERVE_COMMON_TRANSPORT_KV_TRANSPORT_MODE_H_
#define PDSERVE_COMMON_TRANSPORT_KV_TRANSPORT_MODE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::transport {

// auto: UCX when both workers have it (RDMA, shared memory or TCP, as UCX
// picks), else gRPC; ucx: UCX or fail the push; grpc: bytes inline in the
// gRPC stream.
enum class KvTransportMode { kAuto, kUcx, kGrpc };
absl::StatusOr<KvTransportMode> ParseKvTransportMode(absl::string_view name);

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_KV_TRANSPORT_MODE_H_
