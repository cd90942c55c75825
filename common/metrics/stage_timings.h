// The stages of one request's life and their measured durations. Each stage
// is timed by the process where it happens (steady clock of that process) and
// carried to the router; clocks of different processes are never subtracted.
// Plain value types: thread-compatible.
#ifndef PDSERVE_COMMON_METRICS_STAGE_TIMINGS_H_
#define PDSERVE_COMMON_METRICS_STAGE_TIMINGS_H_

#include <array>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace pdserve::metrics {

// In request order. The `stage` label of pdserve_request_stage_seconds is
// StageName(stage). Every stage but kv_transfer lies on the request's
// critical path and they do not overlap, so their sum is the end-to-end
// latency less the network hops between processes (docs/observability.md has
// the picture). Colocated requests (prefill on the decode worker) have
// router_queue, prefill_compute and decode only.
enum class Stage {
  kRouterQueue = 0,  // router: arrival -> first worker RPC sent (validation,
                     // tokenization, worker choice, failed attempts)
  kPrefillQueue,     // prefill worker: RPC received -> batch compute begins
  kPrefillCompute,   // prefill worker: batch compute begins -> first token
                     // sampled. Colocated: decode worker, Decode RPC received
                     // -> first token sampled (waiting for a batch slot
                     // included; no prefill_queue)
  kKvTransfer,       // decode worker: first KV push message received -> last
                     // chunk verified and acknowledged. Overlaps prefill
                     // compute (layers stream while later layers compute):
                     // NOT on the critical path
  kKvTransferTail,   // decode worker: the router's claim (Decode RPC)
                     // received -> KV complete; 0 when it was already
                     // complete. The part of kv_transfer not hidden by compute
  kDecodeAdmission,  // decode worker: KV complete and claimed -> submitted to
                     // the continuous batch
  kFirstDecodeStep,  // decode worker: submitted -> first decode token
  kDecode,           // decode worker: first decode token -> last token
                     // (colocated: first token -> last token)
};
inline constexpr int kNumStages = 8;

// "router_queue", "prefill_queue", ..., "decode".
const char* StageName(Stage stage);
std::optional<Stage> StageFromName(absl::string_view name);
const std::array<Stage, kNumStages>& AllStages();

// Seconds per stage; a stage that did not happen (e.g. kv_transfer in
// colocated mode) stays unset (explicit presence, never 0) and is not
// observed.
struct StageTimings {
  std::array<std::optional<double>, kNumStages> seconds{};

  void Set(Stage s, double value) { seconds[static_cast<int>(s)] = value; }
  std::optional<double> Get(Stage s) const {
    return seconds[static_cast<int>(s)];
  }

  // Sum of the stages on the critical path of the request's end-to-end
  // latency: every set stage except kv_transfer, which overlaps prefill
  // compute (its exposed part is kv_transfer_tail). See
  // docs/observability.md.
  double CriticalPathSeconds() const;

  // {"router_queue":0.001,...} as a compact JSON object of the set stages.
  std::string ToJson() const;
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_STAGE_TIMINGS_H_
