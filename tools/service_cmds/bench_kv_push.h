// One KV push as `pdserve bench-kv-transfer` times it: a prompt's KV
// (layer-major rows) chunked, copied into the sender's chunk buffers and
// sealed (XXH3) as a prefill worker's export does, announced chunk by
// chunk, committed; and where the sending thread's time went meanwhile,
// which tells a push bound by P's own pass over the bytes from one waiting
// on the decode worker.
#ifndef PDSERVE_TOOLS_SERVICE_CMDS_BENCH_KV_PUSH_H_
#define PDSERVE_TOOLS_SERVICE_CMDS_BENCH_KV_PUSH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/kv/kv_cache.h"
#include "common/transport/kv_transport.h"
#include "nlohmann/json.hpp"

namespace pdserve {

// Seconds of one push on its sending thread (P), by phase.
struct KvPushPhases {
  // Taking chunk buffers, copying the rows into them and sealing them: P's
  // export, bound by this machine's memory bandwidth.
  double seal = 0;
  // KvPushStream::SendBuffer: announcing each chunk and, when P is ahead,
  // waiting for room (its sends in flight, or D's acknowledgements of
  // chunks left in place).
  double post = 0;
  // Commit: D's import of the last chunks and its acknowledgement.
  double commit = 0;
  double total = 0;  // Open to Commit's answer
};

// Pushes `src` (`tokens` tokens of every layer of `layout`, layer-major) to
// `target` with the bench's fingerprint; the push must have gone over
// `want` ("grpc", "ucx"). `phases` (may be null) receives its timings.
absl::Status PushKvOnce(transport::KvSender& sender, const std::string& target,
                        const KvLayout& layout, int tokens,
                        const std::string& src, const std::string& want,
                        KvPushPhases* phases);

// The phases of a path's timed pushes, one per round: medians and the
// rounds' figures, in ms ({"seal", "post", "commit", "total", "rounds"}),
// which show whether a slow round was slow in P's own pass over the bytes
// or waiting on D.
nlohmann::json KvPushPhasesJson(const std::vector<KvPushPhases>& rounds);
// One line of them for the text report: `name`'s medians, the seal's
// bandwidth over `bytes`, and each round's total/seal.
void PrintKvPushPhases(const std::string& name,
                       const std::vector<KvPushPhases>& rounds, int64_t bytes);

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_SERVICE_CMDS_BENCH_KV_PUSH_H_
