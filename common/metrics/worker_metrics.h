// Metric bundles of the two worker roles. PrefillMetrics and DecodeMetrics
// are built once per worker process on its MetricsServer's registry; they
// share two role-labelled parts (KV pool occupancy, prefill compute, which a
// decode worker also does for colocated requests). Every method is
// thread-safe (prometheus-cpp metrics are atomic).
#ifndef PDSERVE_COMMON_METRICS_WORKER_METRICS_H_
#define PDSERVE_COMMON_METRICS_WORKER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace pdserve::metrics {

// pdserve_kv_blocks_used / _total / pdserve_kv_usage_ratio {role}.
class KvPoolMetrics {
 public:
  KvPoolMetrics(prometheus::Registry& registry, absl::string_view role);
  // Call after blocks are taken or freed (or from a periodic poll).
  void Set(int64_t used_blocks, int64_t total_blocks);

 private:
  prometheus::Gauge& used_;
  prometheus::Gauge& total_;
  prometheus::Gauge& ratio_;
};

// pdserve_kv_ucx_* {role}: what the worker's UCX KV transport holds.
class UcxTransportMetrics {
 public:
  UcxTransportMetrics(prometheus::Registry& registry, absl::string_view role);
  // Call from a periodic poll (the worker's Status handler);
  // `endpoint_errors` is cumulative.
  void Set(int64_t endpoints, int64_t registered_bytes, int64_t transfers,
           int64_t endpoint_errors, int64_t mapped_buffers);

 private:
  prometheus::Gauge& endpoints_;
  prometheus::Gauge& registered_bytes_;
  prometheus::Gauge& transfers_;
  prometheus::Gauge& mapped_buffers_;
  prometheus::Counter& endpoint_errors_;
  std::atomic<int64_t> errors_seen_{0};
};

// Prefill compute and prefix cache {role}.
class PrefillComputeMetrics {
 public:
  PrefillComputeMetrics(prometheus::Registry& registry, absl::string_view role);
  // One request's prefill: wall seconds and prompt tokens actually computed.
  void ObserveCompute(double seconds, int64_t computed_tokens);
  // One prefix-cache lookup: prompt tokens looked up and tokens found.
  void ObservePrefixLookup(int64_t query_tokens, int64_t hit_tokens);

 private:
  prometheus::Histogram& compute_seconds_;
  prometheus::Counter& computed_tokens_;
  prometheus::Counter& prefix_queries_;
  prometheus::Counter& prefix_hits_;
};

class PrefillMetrics {
 public:
  explicit PrefillMetrics(prometheus::Registry& registry);

  void SetQueueDepth(int64_t requests);
  // One forward pass over `sequences` prompts with `tokens` new tokens.
  void ObserveBatch(int64_t sequences, int64_t tokens);
  // A forward pass's compute thread sealed KV chunks for `seconds`.
  void ObserveKvExport(double seconds);
  // A push acknowledged by the decode worker: payload bytes, first byte sent
  // to last ack, transport ("grpc" | "ucx"). Adds bytes by
  // transport, observes seconds and bytes/seconds, counts the push by
  // transport.
  void PushSucceeded(int64_t bytes, double seconds,
                     const std::string& transport = "grpc");
  // A push that failed; reason label = lower-case code name ("data_loss").
  void PushFailed(absl::StatusCode code);

  PrefillComputeMetrics& compute() { return compute_; }
  KvPoolMetrics& kv_pool() { return kv_pool_; }
  UcxTransportMetrics& ucx() { return ucx_; }

 private:
  prometheus::Gauge& queue_depth_;
  prometheus::Histogram& batch_size_;
  prometheus::Histogram& batch_tokens_;
  prometheus::Histogram& kv_export_seconds_;
  prometheus::Family<prometheus::Counter>& pushed_bytes_;  // by transport
  prometheus::Histogram& push_seconds_;
  prometheus::Histogram& push_bandwidth_;
  prometheus::Family<prometheus::Counter>& push_failures_;
  prometheus::Family<prometheus::Counter>& pushes_;  // by transport
  PrefillComputeMetrics compute_;
  KvPoolMetrics kv_pool_;
  UcxTransportMetrics ucx_;
};

class DecodeMetrics {
 public:
  explicit DecodeMetrics(prometheus::Registry& registry);

  void SetRunning(int64_t sequences);
  void SetWaiting(int64_t sequences);
  // One scheduler step: decoding sequences in it (0 for a step that only
  // prefilled: batch size not observed) and its wall time.
  void ObserveStep(int64_t batch_size, double seconds);
  // Tokens streamed to the router.
  void AddGeneratedTokens(int64_t tokens);
  // A push completely received and verified: payload bytes, transport
  // ("grpc" | "ucx").
  void KvPushReceived(int64_t bytes, const std::string& transport = "grpc");
  // KV complete and claimed -> admitted into the batch.
  void ObserveAdmissionWait(double seconds);
  void CountPreemption();
  void CountLeaseExpiry();
  void CountChecksumFailure();

  // Local (colocated) prefills and this worker's KV pool, role="decode".
  PrefillComputeMetrics& compute() { return compute_; }
  KvPoolMetrics& kv_pool() { return kv_pool_; }
  UcxTransportMetrics& ucx() { return ucx_; }

 private:
  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Histogram& batch_size_;
  prometheus::Histogram& step_seconds_;
  prometheus::Counter& generated_tokens_;
  prometheus::Family<prometheus::Counter>& received_bytes_;  // by transport
  prometheus::Histogram& admission_wait_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& lease_expiries_;
  prometheus::Counter& checksum_failures_;
  PrefillComputeMetrics compute_;
  KvPoolMetrics kv_pool_;
  UcxTransportMetrics ucx_;
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_WORKER_METRICS_H_
