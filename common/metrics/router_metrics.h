// RouterMetrics: the router's metrics (request latencies as the client sees
// them, token counts, worker health, per-stage timings). Build one per router
// process on its MetricsServer's registry; every method is thread-safe
// (prometheus-cpp metrics are atomic; label lookups lock inside the family).
#ifndef PDSERVE_COMMON_METRICS_ROUTER_METRICS_H_
#define PDSERVE_COMMON_METRICS_ROUTER_METRICS_H_

#include <array>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/metrics/stage_timings.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace pdserve::metrics {

// What the router knows about a request when it sends the final message (or
// the final error status).
struct RequestSummary {
  absl::StatusCode code = absl::StatusCode::kOk;
  int64_t prompt_tokens = 0;  // 0 when the request failed before tokenizing
  int64_t output_tokens = 0;  // tokens sent to the client
  std::optional<double> ttft_seconds;  // unset if no token was sent
  double e2e_seconds = 0;  // arrival -> final message (router clock)
  StageTimings stages;     // as measured by router, P and D
};

class RouterMetrics {
 public:
  explicit RouterMetrics(prometheus::Registry& registry);

  // Call when a Generate call arrives (requests_in_flight + 1).
  void RequestStarted();
  // Call exactly once per RequestStarted(), with the outcome: in-flight - 1,
  // requests_total{code}, prompt tokens, e2e/TPOT (successful requests only),
  // queue time (router_queue + prefill_queue) and every measured stage.
  void RequestFinished(const RequestSummary& summary);

  // When the first token is sent to the client.
  void ObserveTimeToFirstToken(double seconds);
  // When a message with `tokens` new tokens is sent, `gap_seconds` after the
  // previous one (pass no gap for the first message).
  void TokensSent(int64_t tokens, std::optional<double> gap_seconds);

  // pool: "prefill" or "decode"; endpoint: "host:port".
  void SetWorkerHealthy(absl::string_view pool, absl::string_view endpoint,
                        bool healthy);
  // The worker left discovery (e.g. DNS no longer lists it).
  void RemoveWorker(absl::string_view pool, absl::string_view endpoint);

  void CountRetry();
  void CountMigration();
  // A request found no healthy worker in a pool and waits for one.
  void CountWorkerWait();

  // One answered HTTP request (endpoint: the API path, or "other").
  void CountHttpRequest(absl::string_view endpoint, int http_status);
  // Admission queue: its length, and one wait (admitted or not).
  void SetAdmissionQueueLength(int64_t waiting);
  void SetAdmissionLimit(int64_t limit);  // 0 = unbounded
  void ObserveAdmissionWait(double seconds);

  // Time per output token as RequestFinished computes it:
  // (e2e - ttft) / (output_tokens - 1); nullopt with fewer than 2 tokens.
  static std::optional<double> TimePerOutputToken(const RequestSummary& s);

 private:
  prometheus::Family<prometheus::Counter>& requests_total_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& itl_;
  prometheus::Histogram& tpot_;
  prometheus::Histogram& e2e_;
  prometheus::Histogram& queue_time_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Gauge& in_flight_;
  prometheus::Family<prometheus::Gauge>& worker_healthy_;
  prometheus::Counter& retries_;
  prometheus::Counter& migrations_;
  prometheus::Counter& worker_waits_;
  prometheus::Family<prometheus::Counter>& http_requests_;
  prometheus::Gauge& admission_queue_length_;
  prometheus::Gauge& admission_limit_;
  prometheus::Histogram& admission_wait_;
  std::array<prometheus::Histogram*, kNumStages> stage_seconds_;
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_ROUTER_METRICS_H_
