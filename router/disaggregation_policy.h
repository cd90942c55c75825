// The --mode=auto policy: decides per request whether to prefill on the
// decode worker (colocated path) or on a prefill worker, from the workers'
// measured prefill cost, queues and KV receive bandwidth (reported in
// WorkerStatusResponse). A pure function of its inputs: thread-safe.
#ifndef PDSERVE_ROUTER_DISAGGREGATION_POLICY_H_
#define PDSERVE_ROUTER_DISAGGREGATION_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>

namespace pdserve {

// What one worker measured (0 = not measured yet).
struct PrefillCostInputs {
  double tokens_per_second = 0;  // marginal prefill throughput
  double overhead_seconds = 0;   // fixed cost of one prefill
  int64_t queued_tokens = 0;     // accepted, not yet prefilled
};

struct DisaggregationInputs {
  int prompt_tokens = 0;
  // The least loaded prefill worker; none when the pool has no healthy one.
  std::optional<PrefillCostInputs> prefill;
  PrefillCostInputs decode;  // the decode worker picked for the request
  int decode_running = 0;    // sequences in D's decode batch
  double kv_receive_bytes_per_second = 0;  // D (0 = unknown: ignored)
  int64_t kv_bytes_per_token = 0;          // all layers
  int num_layers = 0;
  // Measured by the router: Prefill RPC sent -> D admitted, less P's queue
  // and compute (the hop and the unhidden transfer of the P path).
  double handoff_seconds = 0;
};

struct DisaggregationPolicyOptions {
  // Before measurements exist: prompts shorter than this prefill on D.
  int threshold_tokens = 32;
  // Weight of one running sequence's stall (seconds it waits for D's
  // prefill) against the new request's time to first token.
  double stall_weight = 1.0;
};

struct DisaggregationDecision {
  bool prefill_on_decode = false;
  std::string reason;                             // "threshold" | "estimate"
  std::optional<double> estimate_prefill_worker;  // seconds
  std::optional<double> estimate_decode_worker;   // seconds (stall included)
};

// P path: overhead_P + (queue_P + n) / rate_P + handoff + one layer's share
// of the KV bytes / D's receive bandwidth (the rest overlaps P's compute).
// D path: overhead_D + (queue_D + n) / rate_D + stall_weight * running_D *
// n / rate_D (every running sequence waits for the prompt's compute).
// Picks the smaller (D on a tie); the threshold rule when P or D has no
// measurement yet; D when no prefill worker is healthy.
DisaggregationDecision DecidePrefillLocation(
    const DisaggregationInputs& in, const DisaggregationPolicyOptions& options);

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_DISAGGREGATION_POLICY_H_
