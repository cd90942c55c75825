#include "router/disaggregation_policy.h"

namespace pdserve {

DisaggregationDecision DecidePrefillLocation(
    const DisaggregationInputs& in,
    const DisaggregationPolicyOptions& options) {
  DisaggregationDecision d;
  const double n = in.prompt_tokens;
  const bool measured = in.prefill.has_value() &&
                        in.prefill->tokens_per_second > 0 &&
                        in.decode.tokens_per_second > 0;
  if (!measured) {
    d.reason = "threshold";
    d.prefill_on_decode =
        !in.prefill.has_value() || in.prompt_tokens < options.threshold_tokens;
    return d;
  }
  const PrefillCostInputs& p = *in.prefill;
  double est_p =
      p.overhead_seconds +
      (static_cast<double>(p.queued_tokens) + n) / p.tokens_per_second +
      in.handoff_seconds;
  if (in.kv_receive_bytes_per_second > 0 && in.kv_bytes_per_token > 0 &&
      in.num_layers > 0) {
    est_p += n * static_cast<double>(in.kv_bytes_per_token) / in.num_layers /
             in.kv_receive_bytes_per_second;
  }
  const PrefillCostInputs& dw = in.decode;
  const double own = n / dw.tokens_per_second;
  const double est_d =
      dw.overhead_seconds +
      static_cast<double>(dw.queued_tokens) / dw.tokens_per_second + own +
      options.stall_weight * in.decode_running * own;
  d.reason = "estimate";
  d.estimate_prefill_worker = est_p;
  d.estimate_decode_worker = est_d;
  d.prefill_on_decode = est_d <= est_p;
  return d;
}

}  // namespace pdserve
