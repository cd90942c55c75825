// The catalogue of every metric pdserve exports: name, type, labels, unit and
// meaning. The metric bundles build their families from this table (so help
// text has one source), the unit test checks that a scrape shows exactly these
// names, and docs/observability.md mirrors it. Immutable data: thread-safe.
#ifndef PDSERVE_COMMON_METRICS_METRIC_DEFS_H_
#define PDSERVE_COMMON_METRICS_METRIC_DEFS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pdserve::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// Which process exports the metric ("router", "prefill", "decode", or several
// joined by '|': those carry a `role` label).
struct MetricDef {
  const char* name;
  MetricType type;
  const char* roles;
  const char* labels;  // comma-separated label names, "" for none
  const char* unit;
  const char* help;
};

// Every metric, in documentation order.
absl::Span<const MetricDef> AllMetricDefs();

// The definition of `name`, or nullptr.
const MetricDef* FindMetricDef(absl::string_view name);

// "counter", "gauge" or "histogram" (the Prometheus # TYPE word).
const char* MetricTypeName(MetricType type);

// Histogram bucket upper bounds. They suit a CPU toy model and a GPU alike:
// latencies 1-2.5-5 steps from 0.5 ms to 60 s; counts and tokens powers of two.
std::vector<double> LatencyBuckets();
std::vector<double> BatchSizeBuckets();   // 1 .. 1024 sequences
std::vector<double> TokenCountBuckets();  // 1 .. 65536 tokens
std::vector<double> BandwidthBuckets();   // 1 MB/s .. 100 GB/s, 1-2.5-5 steps

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_METRIC_DEFS_H_
