// Reference measurements for `pdserve bench-kv-transfer`: the same bytes
// over a plain TCP loopback socket, and UCX's own ucx_perftest (two
// processes, the message size and transports of the UCX rows), so the KV
// transports read as ratios to what the machine and UCX themselves reach.
#ifndef PDSERVE_TOOLS_SERVICE_CMDS_BENCH_KV_REFS_H_
#define PDSERVE_TOOLS_SERVICE_CMDS_BENCH_KV_REFS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pdserve {

// Sends `src` over a fresh TCP loopback connection; the receiver reads it
// all into `dst` and answers one byte.
absl::Status TcpOnce(const std::string& src, std::string* dst);

// Runs `ucx_perftest` (from PATH; Debian's ucx-utils) as a server and a
// client on loopback: `test` (tag_bw, ucp_get, ...) of `iterations`
// messages of `message_bytes`, with UCX_TLS=`tls` for both ("" = UCX's
// default). Returns its overall bandwidth in GB/s (10^9 bytes/s).
// NOT_FOUND when ucx_perftest is not installed.
absl::StatusOr<double> UcxPerftestGbps(const std::string& test,
                                       int64_t message_bytes, int iterations,
                                       const std::string& tls);

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_SERVICE_CMDS_BENCH_KV_REFS_H_
