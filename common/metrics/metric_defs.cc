#include "common/metrics/metric_defs.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace pdserve::metrics {
namespace {

constexpr MetricType kC = MetricType::kCounter;
constexpr MetricType kG = MetricType::kGauge;
constexpr MetricType kH = MetricType::kHistogram;

// docs/observability.md mirrors this table; keep them in step.
constexpr MetricDef kDefs[] = {
    // All roles.
    {"pdserve_build_info", kG, "router|prefill|decode", "role", "1",
     "Always 1; the role label says which pdserve role this process runs."},
    // Router.
    {"pdserve_requests_total", kC, "router", "code", "requests",
     "Generate requests finished, by final gRPC status code name."},
    {"pdserve_time_to_first_token_seconds", kH, "router", "", "seconds",
     "Request arrival at the router to the first token sent to the client."},
    {"pdserve_inter_token_latency_seconds", kH, "router", "", "seconds",
     "Gap between two consecutive tokens sent to the client (one sample per "
     "token after the first)."},
    {"pdserve_time_per_output_token_seconds", kH, "router", "", "seconds",
     "Per request: (e2e latency - TTFT) / (output tokens - 1); requests with "
     "one token are not observed."},
    {"pdserve_e2e_request_latency_seconds", kH, "router", "", "seconds",
     "Request arrival at the router to its final message."},
    {"pdserve_request_queue_time_seconds", kH, "router", "", "seconds",
     "Time a request waited before its prefill compute began: the router_queue "
     "plus prefill_queue stages."},
    {"pdserve_prompt_tokens_total", kC, "router", "", "tokens",
     "Prompt tokens of finished requests."},
    {"pdserve_generation_tokens_total", kC, "router", "", "tokens",
     "Output tokens sent to clients."},
    {"pdserve_requests_in_flight", kG, "router", "", "requests",
     "Generate requests currently being served."},
    {"pdserve_worker_healthy", kG, "router", "endpoint,pool", "1",
     "1 if the router's health check of this worker passes, else 0; pool is "
     "prefill or decode."},
    {"pdserve_request_retries_total", kC, "router", "", "retries",
     "Attempts re-sent to another worker (UNAVAILABLE/RESOURCE_EXHAUSTED "
     "before any token)."},
    {"pdserve_request_migrations_total", kC, "router", "", "migrations",
     "Requests moved to another decode worker mid-stream."},
    {"pdserve_request_worker_waits_total", kC, "router", "", "worker waits",
     "Requests that found no healthy worker in a pool (its workers "
     "restarting) and waited for one (--worker_wait)."},
    {"pdserve_http_requests_total", kC, "router", "code,endpoint", "requests",
     "HTTP requests answered by the router's OpenAI-compatible API, by "
     "endpoint (/v1/chat/completions, ...; \"other\" for unknown paths) and "
     "HTTP status code (a stream counts once, with the status it started "
     "with)."},
    {"pdserve_admission_queue_length", kG, "router", "", "requests",
     "Requests waiting for admission (the admission limit were running)."},
    {"pdserve_admission_limit", kG, "router", "", "requests",
     "Requests the router runs at once: --max_in_flight, lowered to what "
     "its healthy workers hold (each pool's summed request capacity); 0 = "
     "unbounded."},
    {"pdserve_admission_wait_seconds", kH, "router", "", "seconds",
     "Time a request waited for admission, whether it was then admitted or "
     "gave up (admission timeout, deadline, cancellation)."},
    {"pdserve_request_stage_seconds", kH, "router", "stage", "seconds",
     "Per-request stage durations, each measured by the process where the "
     "stage happens (router_queue, prefill_queue, prefill_compute, "
     "kv_transfer, kv_transfer_tail, decode_admission, first_decode_step, "
     "decode); see docs/observability.md for the picture."},
    // Prefill worker (and decode worker for local prefill: role label).
    {"pdserve_prefill_queue_depth", kG, "prefill", "", "requests",
     "Prefill requests waiting to be batched."},
    {"pdserve_prefill_batch_size", kH, "prefill", "", "sequences",
     "Sequences in one prefill forward pass."},
    {"pdserve_prefill_batch_tokens", kH, "prefill", "", "tokens",
     "Prompt tokens computed in one prefill forward pass."},
    {"pdserve_prefill_kv_export_seconds", kH, "prefill", "", "seconds",
     "Wall time one prefill forward pass spent sealing KV chunks for its "
     "pushes (between its layers, with a reused prefix's at admission): "
     "what pushing the KV adds to the prefill's own time."},
    {"pdserve_prefill_compute_seconds", kH, "prefill|decode", "role", "seconds",
     "Wall time of one request's prefill compute (all its chunks); decode "
     "workers report local (colocated) prefills."},
    {"pdserve_prefill_computed_tokens_total", kC, "prefill|decode", "role",
     "tokens",
     "Prompt tokens run through the model (prefix-cache hits excluded)."},
    {"pdserve_prefix_cache_queries_tokens_total", kC, "prefill|decode", "role",
     "tokens", "Prompt tokens looked up in the prefix cache."},
    {"pdserve_prefix_cache_hits_tokens_total", kC, "prefill|decode", "role",
     "tokens",
     "Prompt tokens found in the prefix cache (prefill workers have no "
     "prefix cache yet: 0 there)."},
    {"pdserve_kv_pushed_bytes_total", kC, "prefill", "transport", "bytes",
     "KV cache payload bytes pushed to decode workers (acknowledged), by "
     "transport (as pdserve_kv_pushes_total)."},
    {"pdserve_kv_push_seconds", kH, "prefill", "", "seconds",
     "One KV push, first byte sent to last acknowledgement."},
    {"pdserve_kv_push_bandwidth_bytes_per_second", kH, "prefill", "",
     "bytes/second",
     "Achieved bandwidth of one KV push: bytes / push seconds."},
    {"pdserve_kv_pushes_total", kC, "prefill", "transport", "pushes",
     "KV pushes acknowledged by decode workers, by transport: ucx (bytes "
     "sent with UCX from this worker's registered memory: RDMA, shared "
     "memory or TCP) or grpc (bytes in the gRPC stream)."},
    {"pdserve_kv_push_failures_total", kC, "prefill", "reason", "pushes",
     "KV pushes that did not complete, by reason (the lower-case status "
     "code name; cancelled: the router or the client aborted the request). "
     "A push dropped because its request ended at the first token is not "
     "counted."},
    // KV pool: both worker roles have one.
    {"pdserve_kv_blocks_used", kG, "prefill|decode", "role", "blocks",
     "KV cache blocks in use."},
    {"pdserve_kv_blocks_capacity", kG, "prefill|decode", "role", "blocks",
     "KV cache blocks in the pool (total; not named _total, which is for "
     "counters)."},
    {"pdserve_kv_usage_ratio", kG, "prefill|decode", "role", "ratio",
     "kv_blocks_used / kv_blocks_capacity, 0..1."},
    // UCX KV transport: both worker roles.
    {"pdserve_kv_ucx_endpoints", kG, "prefill|decode", "role", "endpoints",
     "UCX endpoints open to peer workers (a prefill worker keeps one per "
     "decode worker it pushes to: closed on a UCX endpoint error, after a "
     "failed push, or after 30 s unused)."},
    {"pdserve_kv_ucx_registered_bytes", kG, "prefill|decode", "role", "bytes",
     "Memory registered with UCX: a prefill worker's pooled export rings "
     "and chunk buffers, a decode worker's landing buffers (registered "
     "once, reused)."},
    {"pdserve_kv_ucx_transfers", kG, "prefill|decode", "role", "pushes",
     "KV pushes holding UCX resources now (prefill: UCX pushes open; "
     "decode: pushes holding a landing buffer)."},
    {"pdserve_kv_ucx_mapped_buffers", kG, "prefill|decode", "role", "buffers",
     "Decode: prefill workers' export buffers mapped into this process "
     "(same host: chunks imported in place, without a copy); cached while "
     "reused, dropped after 30 s unused or a failed push. Prefill: 0."},
    {"pdserve_kv_ucx_endpoint_errors_total", kC, "prefill|decode", "role",
     "errors",
     "UCX endpoint errors: a peer worker died or became unreachable (the "
     "pushes over that endpoint fail like a broken gRPC stream)."},
    // Decode worker.
    {"pdserve_decode_running_sequences", kG, "decode", "", "sequences",
     "Sequences in the continuous batch."},
    {"pdserve_decode_waiting_sequences", kG, "decode", "", "sequences",
     "Sequences queued for admission into the batch (preempted ones "
     "included)."},
    {"pdserve_decode_batch_size", kH, "decode", "", "sequences",
     "Decoding sequences in one scheduler step (steps that only prefill "
     "colocated prompts are not observed)."},
    {"pdserve_decode_step_seconds", kH, "decode", "", "seconds",
     "Wall time of one scheduler step (forward + sampling) of the whole "
     "batch."},
    {"pdserve_decode_generated_tokens_total", kC, "decode", "", "tokens",
     "Output tokens the decode worker streamed to routers (the first token "
     "of a disaggregated request is sampled by the prefill worker and not "
     "counted here; that of a colocated request is)."},
    {"pdserve_kv_received_bytes_total", kC, "decode", "transport", "bytes",
     "KV cache payload bytes received and verified from prefill workers, by "
     "transport (ucx, grpc)."},
    {"pdserve_decode_admission_wait_seconds", kH, "decode", "", "seconds",
     "KV complete and claimed by the router to submission into the "
     "continuous batch (the decode_admission stage)."},
    {"pdserve_decode_preemptions_total", kC, "decode", "", "preemptions",
     "Sequences preempted out of the batch for lack of KV blocks."},
    {"pdserve_kv_lease_expiries_total", kC, "decode", "", "leases",
     "KV reservations freed because their lease expired (push never "
     "completed or sequence never claimed)."},
    {"pdserve_kv_checksum_failures_total", kC, "decode", "", "chunks",
     "KV chunks whose checksum did not match (request failed with "
     "DATA_LOSS)."},
};

// 1, 2.5, 5 x 10^e within [from, to]. Values are parsed from decimal text so
// each is the double nearest its short decimal form (le="0.0025", not
// le="0.0025000000000000001").
std::vector<double> OneTwoFive(double from, double to) {
  std::vector<double> out;
  for (int e = -12; e <= 15; ++e) {
    for (const char* m : {"1", "2.5", "5"}) {
      const double v = std::strtod(absl::StrCat(m, "e", e).c_str(), nullptr);
      if (v >= from * 0.9999 && v <= to * 1.0001) out.push_back(v);
    }
  }
  return out;
}

std::vector<double> PowersOfTwo(int max_exponent) {
  std::vector<double> out;
  for (int e = 0; e <= max_exponent; ++e) out.push_back(std::ldexp(1.0, e));
  return out;
}

}  // namespace

absl::Span<const MetricDef> AllMetricDefs() { return kDefs; }

const MetricDef* FindMetricDef(absl::string_view name) {
  for (const MetricDef& def : kDefs) {
    if (name == def.name) return &def;
  }
  return nullptr;
}

const char* MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::vector<double> LatencyBuckets() {
  // 0.0005, 0.001, 0.0025, ..., 25, 50, then 60 s as the last finite bucket.
  std::vector<double> b = OneTwoFive(0.0005, 50);
  b.push_back(60);
  return b;
}
std::vector<double> BatchSizeBuckets() { return PowersOfTwo(10); }
std::vector<double> TokenCountBuckets() { return PowersOfTwo(16); }
std::vector<double> BandwidthBuckets() { return OneTwoFive(1e6, 1e11); }

}  // namespace pdserve::metrics
