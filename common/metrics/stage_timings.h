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
// StageName(stage).
enum class Stage {
  kRouterQueue = 0,  // router: arrival -> Prefill RPC sent (validation,
                     // tokenization, worker choice, retries)
  kPrefillQueue,     // prefill worker: RPC received -> batch compute begins
  kPrefillCompute,   // prefill worker: compute begins -> first token sampled
  kKvTransfer,       // prefill worker: first KV byte sent -> last ack
  kDecodeAdmission,  // decode worker: Decode claim received -> admitted
  kFirstDecodeStep,  // decode worker: admitted -> first decode step done
  kDecode,           // decode worker: first step done -> last token
};
inline constexpr int kNumStages = 7;

// "router_queue", "prefill_queue", ..., "decode".
const char* StageName(Stage stage);
std::optional<Stage> StageFromName(absl::string_view name);
const std::array<Stage, kNumStages>& AllStages();

// Seconds per stage; a stage that did not happen (e.g. kv_transfer in
// colocated mode) stays unset and is not observed.
struct StageTimings {
  std::array<std::optional<double>, kNumStages> seconds{};

  void Set(Stage s, double value) { seconds[static_cast<int>(s)] = value; }
  std::optional<double> Get(Stage s) const {
    return seconds[static_cast<int>(s)];
  }

  // Sum of the stages on the critical path of the request's end-to-end
  // latency. kv_transfer overlaps prefill compute and decode admission (the
  // push streams while later layers compute, and admission waits for its
  // end), so it is excluded: see docs/observability.md.
  double CriticalPathSeconds() const;

  // {"router_queue":0.001,...} as a compact JSON object of the set stages.
  std::string ToJson() const;
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_STAGE_TIMINGS_H_
