// The router's configuration (from `pdserve router` flags): mode, retries,
// migration, prefix-aware routing, admission control and request limits.
// Plain values: copy freely.
#ifndef PDSERVE_ROUTER_ROUTER_OPTIONS_H_
#define PDSERVE_ROUTER_ROUTER_OPTIONS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/request_builder.h"

namespace pdserve {

enum class RouterMode { kDisaggregated, kColocated, kAuto };
absl::StatusOr<RouterMode> ParseRouterMode(const std::string& s);
const char* RouterModeName(RouterMode mode);

struct RouterOptions {
  RouterMode mode = RouterMode::kDisaggregated;
  int auto_prefill_threshold =
      32;  // auto: prompts shorter than this prefill on D
  // auto: weight of the decode stall a prefill on D causes to each of its
  // running sequences (router/disaggregation_policy.h).
  double auto_stall_weight = 1.0;
  // disaggregated/auto: when no prefill worker is routable (all down or
  // unreachable, or each refused this request as full or too large for its
  // whole KV pool), the decode worker
  // prefills the request itself instead of the request failing. Outputs are
  // identical either way (DESIGN.md, determinism).
  bool colocated_fallback = true;
  // When a pool has no healthy worker at all (its workers restarting), a
  // request waits up to this long in all for one to pass its health check
  // (never past its deadline), then fails UNAVAILABLE; 0 = fail at once.
  absl::Duration worker_wait = absl::Seconds(10);
  // Tries per request before any token reached the client.
  int max_attempts = 3;
  // Times a stream may move to another (P, D) pair after tokens reached the
  // client (its decode worker failed); 0 = never (the client gets the
  // failure).
  int max_migrations = 2;
  RequestLimits limits;
  // Prefix-aware prefill routing: prompts sharing their first
  // prefix_routing_blocks blocks of kv_block_size tokens go to the same
  // prefill worker (whose prefix cache then holds them) unless it is busier
  // than the least loaded by more than prefix_routing_max_extra_load. 0 = off.
  int prefix_routing_blocks = 2;
  int kv_block_size = 16;
  double prefix_routing_max_extra_load = 2.0;
  // Admission control: requests running at most (0 = unbounded). Beyond, a
  // request waits in a FIFO of at most admission_queue requests for up to
  // admission_timeout (never past its own deadline); a full queue or a wait
  // that times out, and workers' bounded queues refusing a request on every
  // attempt, answer RESOURCE_EXHAUSTED with the retry hint retry_after_ms
  // (gRPC trailing metadata `retry-after-ms`, HTTP `Retry-After`).
  int max_in_flight = 1024;
  int admission_queue = 4096;
  absl::Duration admission_timeout = absl::Seconds(30);
  int retry_after_ms = 100;
};

// INVALID_ARGUMENT naming the router flag whose value is out of range (a
// max_attempts of 0 would fail every request, a default_max_tokens above
// the cap every request without max_tokens).
absl::Status CheckRouterOptions(const RouterOptions& options);

// Trailing metadata key of the retry hint on RESOURCE_EXHAUSTED.
inline constexpr char kRetryAfterMsKey[] = "retry-after-ms";

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_ROUTER_OPTIONS_H_
