// Builds (or finds, when another bundle of the same registry already built
// it) the prometheus-cpp family of a metric named in metric_defs.h, with the
// help text and type from that table. Thread-safe (prometheus::Registry is).
#ifndef PDSERVE_COMMON_METRICS_FAMILIES_H_
#define PDSERVE_COMMON_METRICS_FAMILIES_H_

#include "absl/strings/string_view.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve::metrics {

// Each aborts if `name` is not in AllMetricDefs() with that type: a metric
// that is not in the catalogue is a programming error.
prometheus::Family<prometheus::Counter>& CounterFamily(
    prometheus::Registry& registry, absl::string_view name);
prometheus::Family<prometheus::Gauge>& GaugeFamily(
    prometheus::Registry& registry, absl::string_view name);
prometheus::Family<prometheus::Histogram>& HistogramFamily(
    prometheus::Registry& registry, absl::string_view name);

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_FAMILIES_H_
