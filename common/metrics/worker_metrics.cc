#include "common/metrics/worker_metrics.h"

#include <string>

#include "absl/strings/ascii.h"
#include "common/metrics/families.h"
#include "common/metrics/metric_defs.h"

namespace pdserve::metrics {
namespace {

prometheus::Labels RoleLabel(absl::string_view role) {
  return {{"role", std::string(role)}};
}

std::string ReasonLabel(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

void SetBuildInfo(prometheus::Registry& registry, absl::string_view role) {
  GaugeFamily(registry, "pdserve_build_info").Add(RoleLabel(role)).Set(1);
}

}  // namespace

KvPoolMetrics::KvPoolMetrics(prometheus::Registry& registry,
                             absl::string_view role)
    : used_(
          GaugeFamily(registry, "pdserve_kv_blocks_used").Add(RoleLabel(role))),
      total_(GaugeFamily(registry, "pdserve_kv_blocks_capacity")
                 .Add(RoleLabel(role))),
      ratio_(GaugeFamily(registry, "pdserve_kv_usage_ratio")
                 .Add(RoleLabel(role))) {}

void KvPoolMetrics::Set(int64_t used_blocks, int64_t total_blocks) {
  used_.Set(static_cast<double>(used_blocks));
  total_.Set(static_cast<double>(total_blocks));
  ratio_.Set(total_blocks > 0 ? static_cast<double>(used_blocks) /
                                    static_cast<double>(total_blocks)
                              : 0.0);
}

constexpr const char* kTransports[] = {"grpc", "ucx"};

UcxTransportMetrics::UcxTransportMetrics(prometheus::Registry& registry,
                                         absl::string_view role)
    : endpoints_(GaugeFamily(registry, "pdserve_kv_ucx_endpoints")
                     .Add(RoleLabel(role))),
      registered_bytes_(GaugeFamily(registry, "pdserve_kv_ucx_registered_bytes")
                            .Add(RoleLabel(role))),
      transfers_(GaugeFamily(registry, "pdserve_kv_ucx_transfers")
                     .Add(RoleLabel(role))),
      mapped_buffers_(GaugeFamily(registry, "pdserve_kv_ucx_mapped_buffers")
                          .Add(RoleLabel(role))),
      endpoint_errors_(
          CounterFamily(registry, "pdserve_kv_ucx_endpoint_errors_total")
              .Add(RoleLabel(role))) {}

void UcxTransportMetrics::Set(int64_t endpoints, int64_t registered_bytes,
                              int64_t transfers, int64_t endpoint_errors,
                              int64_t mapped_buffers) {
  endpoints_.Set(static_cast<double>(endpoints));
  mapped_buffers_.Set(static_cast<double>(mapped_buffers));
  registered_bytes_.Set(static_cast<double>(registered_bytes));
  transfers_.Set(static_cast<double>(transfers));
  const int64_t seen = errors_seen_.exchange(endpoint_errors);
  if (endpoint_errors > seen) {
    endpoint_errors_.Increment(static_cast<double>(endpoint_errors - seen));
  }
}

PrefillComputeMetrics::PrefillComputeMetrics(prometheus::Registry& registry,
                                             absl::string_view role)
    : compute_seconds_(
          HistogramFamily(registry, "pdserve_prefill_compute_seconds")
              .Add(RoleLabel(role), LatencyBuckets())),
      computed_tokens_(
          CounterFamily(registry, "pdserve_prefill_computed_tokens_total")
              .Add(RoleLabel(role))),
      prefix_queries_(
          CounterFamily(registry, "pdserve_prefix_cache_queries_tokens_total")
              .Add(RoleLabel(role))),
      prefix_hits_(
          CounterFamily(registry, "pdserve_prefix_cache_hits_tokens_total")
              .Add(RoleLabel(role))) {}

void PrefillComputeMetrics::ObserveCompute(double seconds,
                                           int64_t computed_tokens) {
  compute_seconds_.Observe(seconds);
  computed_tokens_.Increment(static_cast<double>(computed_tokens));
}

void PrefillComputeMetrics::ObservePrefixLookup(int64_t query_tokens,
                                                int64_t hit_tokens) {
  prefix_queries_.Increment(static_cast<double>(query_tokens));
  prefix_hits_.Increment(static_cast<double>(hit_tokens));
}

PrefillMetrics::PrefillMetrics(prometheus::Registry& registry)
    : queue_depth_(
          GaugeFamily(registry, "pdserve_prefill_queue_depth").Add({})),
      batch_size_(HistogramFamily(registry, "pdserve_prefill_batch_size")
                      .Add({}, BatchSizeBuckets())),
      batch_tokens_(HistogramFamily(registry, "pdserve_prefill_batch_tokens")
                        .Add({}, TokenCountBuckets())),
      kv_export_seconds_(
          HistogramFamily(registry, "pdserve_prefill_kv_export_seconds")
              .Add({}, LatencyBuckets())),
      pushed_bytes_(CounterFamily(registry, "pdserve_kv_pushed_bytes_total")),
      push_seconds_(HistogramFamily(registry, "pdserve_kv_push_seconds")
                        .Add({}, LatencyBuckets())),
      push_bandwidth_(
          HistogramFamily(registry,
                          "pdserve_kv_push_bandwidth_bytes_per_second")
              .Add({}, BandwidthBuckets())),
      push_failures_(CounterFamily(registry, "pdserve_kv_push_failures_total")),
      pushes_(CounterFamily(registry, "pdserve_kv_pushes_total")),
      compute_(registry, "prefill"),
      kv_pool_(registry, "prefill"),
      ucx_(registry, "prefill") {
  SetBuildInfo(registry, "prefill");
  for (int c = 1; c <= static_cast<int>(absl::StatusCode::kUnauthenticated);
       ++c) {
    push_failures_.Add(
        {{"reason", ReasonLabel(static_cast<absl::StatusCode>(c))}});
  }
  for (const char* t : kTransports) {
    pushes_.Add({{"transport", t}});
    pushed_bytes_.Add({{"transport", t}});
  }
}

void PrefillMetrics::SetQueueDepth(int64_t requests) {
  queue_depth_.Set(static_cast<double>(requests));
}

void PrefillMetrics::ObserveKvExport(double seconds) {
  kv_export_seconds_.Observe(seconds);
}

void PrefillMetrics::ObserveBatch(int64_t sequences, int64_t tokens) {
  batch_size_.Observe(static_cast<double>(sequences));
  batch_tokens_.Observe(static_cast<double>(tokens));
}

void PrefillMetrics::PushSucceeded(int64_t bytes, double seconds,
                                   const std::string& transport) {
  pushes_.Add({{"transport", transport}}).Increment();
  pushed_bytes_.Add({{"transport", transport}})
      .Increment(static_cast<double>(bytes));
  push_seconds_.Observe(seconds);
  if (seconds > 0)
    push_bandwidth_.Observe(static_cast<double>(bytes) / seconds);
}

void PrefillMetrics::PushFailed(absl::StatusCode code) {
  push_failures_.Add({{"reason", ReasonLabel(code)}}).Increment();
}

DecodeMetrics::DecodeMetrics(prometheus::Registry& registry)
    : running_(
          GaugeFamily(registry, "pdserve_decode_running_sequences").Add({})),
      waiting_(
          GaugeFamily(registry, "pdserve_decode_waiting_sequences").Add({})),
      batch_size_(HistogramFamily(registry, "pdserve_decode_batch_size")
                      .Add({}, BatchSizeBuckets())),
      step_seconds_(HistogramFamily(registry, "pdserve_decode_step_seconds")
                        .Add({}, LatencyBuckets())),
      generated_tokens_(
          CounterFamily(registry, "pdserve_decode_generated_tokens_total")
              .Add({})),
      received_bytes_(
          CounterFamily(registry, "pdserve_kv_received_bytes_total")),
      admission_wait_(
          HistogramFamily(registry, "pdserve_decode_admission_wait_seconds")
              .Add({}, LatencyBuckets())),
      preemptions_(
          CounterFamily(registry, "pdserve_decode_preemptions_total").Add({})),
      lease_expiries_(
          CounterFamily(registry, "pdserve_kv_lease_expiries_total").Add({})),
      checksum_failures_(
          CounterFamily(registry, "pdserve_kv_checksum_failures_total")
              .Add({})),
      compute_(registry, "decode"),
      kv_pool_(registry, "decode"),
      ucx_(registry, "decode") {
  SetBuildInfo(registry, "decode");
  for (const char* t : kTransports) received_bytes_.Add({{"transport", t}});
}

void DecodeMetrics::SetRunning(int64_t sequences) {
  running_.Set(static_cast<double>(sequences));
}
void DecodeMetrics::SetWaiting(int64_t sequences) {
  waiting_.Set(static_cast<double>(sequences));
}

void DecodeMetrics::ObserveStep(int64_t batch_size, double seconds) {
  if (batch_size > 0) batch_size_.Observe(static_cast<double>(batch_size));
  step_seconds_.Observe(seconds);
}

void DecodeMetrics::AddGeneratedTokens(int64_t tokens) {
  generated_tokens_.Increment(static_cast<double>(tokens));
}

void DecodeMetrics::KvPushReceived(int64_t bytes,
                                   const std::string& transport) {
  received_bytes_.Add({{"transport", transport}})
      .Increment(static_cast<double>(bytes));
}
void DecodeMetrics::ObserveAdmissionWait(double seconds) {
  admission_wait_.Observe(seconds);
}
void DecodeMetrics::CountPreemption() { preemptions_.Increment(); }
void DecodeMetrics::CountLeaseExpiry() { lease_expiries_.Increment(); }
void DecodeMetrics::CountChecksumFailure() { checksum_failures_.Increment(); }

}  // namespace pdserve::metrics
