// --kv_transport, shared by `pdserve prefill` and `pdserve decode` (and
// `up`, which passes it on), and the mode it names.
#ifndef PDSERVE_TOOLS_SERVICE_CMDS_KV_TRANSPORT_FLAGS_H_
#define PDSERVE_TOOLS_SERVICE_CMDS_KV_TRANSPORT_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/transport/kv_transport_mode.h"

ABSL_DECLARE_FLAG(std::string, kv_transport);

namespace pdserve {

absl::StatusOr<transport::KvTransportMode> KvTransportModeFromFlags();

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_SERVICE_CMDS_KV_TRANSPORT_FLAGS_H_
