#include "common/metrics/router_metrics.h"

#include <string>

#include "common/metrics/families.h"
#include "common/metrics/metric_defs.h"

namespace pdserve::metrics {
namespace {

constexpr absl::StatusCode kMaxStatusCode = absl::StatusCode::kUnauthenticated;

prometheus::Histogram& Latency(prometheus::Registry& registry,
                               absl::string_view name) {
  return HistogramFamily(registry, name).Add({}, LatencyBuckets());
}

prometheus::Labels WorkerLabels(absl::string_view pool,
                                absl::string_view endpoint) {
  return {{"endpoint", std::string(endpoint)}, {"pool", std::string(pool)}};
}

}  // namespace

RouterMetrics::RouterMetrics(prometheus::Registry& registry)
    : requests_total_(CounterFamily(registry, "pdserve_requests_total")),
      ttft_(Latency(registry, "pdserve_time_to_first_token_seconds")),
      itl_(Latency(registry, "pdserve_inter_token_latency_seconds")),
      tpot_(Latency(registry, "pdserve_time_per_output_token_seconds")),
      e2e_(Latency(registry, "pdserve_e2e_request_latency_seconds")),
      queue_time_(Latency(registry, "pdserve_request_queue_time_seconds")),
      prompt_tokens_(
          CounterFamily(registry, "pdserve_prompt_tokens_total").Add({})),
      generation_tokens_(
          CounterFamily(registry, "pdserve_generation_tokens_total").Add({})),
      in_flight_(GaugeFamily(registry, "pdserve_requests_in_flight").Add({})),
      worker_healthy_(GaugeFamily(registry, "pdserve_worker_healthy")),
      retries_(
          CounterFamily(registry, "pdserve_request_retries_total").Add({})),
      migrations_(
          CounterFamily(registry, "pdserve_request_migrations_total").Add({})),
      worker_waits_(
          CounterFamily(registry, "pdserve_request_worker_waits_total")
              .Add({})),
      http_requests_(CounterFamily(registry, "pdserve_http_requests_total")),
      admission_queue_length_(
          GaugeFamily(registry, "pdserve_admission_queue_length").Add({})),
      admission_limit_(
          GaugeFamily(registry, "pdserve_admission_limit").Add({})),
      admission_wait_(Latency(registry, "pdserve_admission_wait_seconds")) {
  GaugeFamily(registry, "pdserve_build_info").Add({{"role", "router"}}).Set(1);
  // Every code exists from the start, so rate() and ratios see zeros.
  for (int c = 0; c <= static_cast<int>(kMaxStatusCode); ++c) {
    requests_total_.Add(
        {{"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(c))}});
  }
  for (const char* endpoint : {"/v1/chat/completions", "/v1/completions"}) {
    http_requests_.Add({{"endpoint", endpoint}, {"code", "200"}});
  }
  auto& stages = HistogramFamily(registry, "pdserve_request_stage_seconds");
  for (Stage s : AllStages()) {
    stage_seconds_[static_cast<int>(s)] =
        &stages.Add({{"stage", StageName(s)}}, LatencyBuckets());
  }
}

void RouterMetrics::RequestStarted() { in_flight_.Increment(); }

std::optional<double> RouterMetrics::TimePerOutputToken(
    const RequestSummary& s) {
  if (s.output_tokens < 2 || !s.ttft_seconds.has_value()) return std::nullopt;
  return (s.e2e_seconds - *s.ttft_seconds) /
         static_cast<double>(s.output_tokens - 1);
}

void RouterMetrics::RequestFinished(const RequestSummary& summary) {
  in_flight_.Decrement();
  requests_total_.Add({{"code", absl::StatusCodeToString(summary.code)}})
      .Increment();
  if (summary.prompt_tokens > 0) {
    prompt_tokens_.Increment(static_cast<double>(summary.prompt_tokens));
  }
  if (summary.code == absl::StatusCode::kOk) {
    e2e_.Observe(summary.e2e_seconds);
    if (auto tpot = TimePerOutputToken(summary)) tpot_.Observe(*tpot);
  }
  const auto router_queue = summary.stages.Get(Stage::kRouterQueue);
  const auto prefill_queue = summary.stages.Get(Stage::kPrefillQueue);
  if (router_queue.has_value() || prefill_queue.has_value()) {
    queue_time_.Observe(router_queue.value_or(0) + prefill_queue.value_or(0));
  }
  for (Stage s : AllStages()) {
    if (auto v = summary.stages.Get(s)) {
      stage_seconds_[static_cast<int>(s)]->Observe(*v);
    }
  }
}

void RouterMetrics::ObserveTimeToFirstToken(double seconds) {
  ttft_.Observe(seconds);
}

void RouterMetrics::TokensSent(int64_t tokens,
                               std::optional<double> gap_seconds) {
  if (tokens <= 0) return;
  generation_tokens_.Increment(static_cast<double>(tokens));
  // One sample per token after the request's first: a message with several
  // tokens waited `gap` for its first token and 0 for the others; the first
  // message's first token is the TTFT, not an inter-token gap.
  if (gap_seconds.has_value()) itl_.Observe(*gap_seconds);
  for (int64_t i = 1; i < tokens; ++i) itl_.Observe(0.0);
}

void RouterMetrics::SetWorkerHealthy(absl::string_view pool,
                                     absl::string_view endpoint, bool healthy) {
  worker_healthy_.Add(WorkerLabels(pool, endpoint)).Set(healthy ? 1 : 0);
}

void RouterMetrics::RemoveWorker(absl::string_view pool,
                                 absl::string_view endpoint) {
  const prometheus::Labels labels = WorkerLabels(pool, endpoint);
  if (worker_healthy_.Has(labels)) {
    worker_healthy_.Remove(&worker_healthy_.Add(labels));
  }
}

void RouterMetrics::CountRetry() { retries_.Increment(); }
void RouterMetrics::CountWorkerWait() { worker_waits_.Increment(); }
void RouterMetrics::CountMigration() { migrations_.Increment(); }

void RouterMetrics::CountHttpRequest(absl::string_view endpoint,
                                     int http_status) {
  http_requests_
      .Add({{"endpoint", std::string(endpoint)},
            {"code", std::to_string(http_status)}})
      .Increment();
}

void RouterMetrics::SetAdmissionQueueLength(int64_t waiting) {
  admission_queue_length_.Set(static_cast<double>(waiting));
}

void RouterMetrics::SetAdmissionLimit(int64_t limit) {
  admission_limit_.Set(static_cast<double>(limit));
}

void RouterMetrics::ObserveAdmissionWait(double seconds) {
  admission_wait_.Observe(seconds);
}

}  // namespace pdserve::metrics
