// The receiving side of `pdserve bench-kv-transfer`, in its own process as a
// decode worker is: KvTransferService instances (inline gRPC; UCX with UCX's
// default transports; UCX with UCX_TLS=tcp) whose sink
// copies every verified chunk into a destination buffer at its layer/token
// place, as D's import does. Started by fork() before the parent makes any
// thread; stopped by the parent (SIGKILL by PID; PR_SET_PDEATHSIG covers a
// parent that dies first).
#ifndef PDSERVE_TOOLS_SERVICE_CMDS_BENCH_KV_RECEIVER_H_
#define PDSERVE_TOOLS_SERVICE_CMDS_BENCH_KV_RECEIVER_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "common/kv/kv_cache.h"

namespace pdserve {

inline constexpr char kKvBenchFingerprint[] = "bench-kv-transfer";

struct KvBenchReceiver {
  pid_t pid = -1;
  int control_fd = -1;  // "verify\n" -> "ok\n" | "differ\n"
  std::string target;   // inline gRPC
  std::string ucx_target;
  std::string ucx_tcp_target;
};

// Forks the receiver for pushes of `tokens` tokens of `layout` whose bytes
// are `expected` (layer-major). UCX services only when asked for.
absl::StatusOr<KvBenchReceiver> StartKvBenchReceiver(
    const KvLayout& layout, int tokens, const std::string& expected, bool ucx,
    bool ucx_tcp);

// Asks the receiver whether its destination holds `expected` (the last
// push's bytes).
absl::Status VerifyKvBenchReceiver(const KvBenchReceiver& r);

// CPU seconds (user + system) process `pid` has used so far.
double CpuSecondsOf(pid_t pid);

void StopKvBenchReceiver(KvBenchReceiver& r);

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_SERVICE_CMDS_BENCH_KV_RECEIVER_H_
