#include "common/metrics/families.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/metrics/metric_defs.h"

namespace pdserve::metrics {
namespace {

const MetricDef& DefOrDie(absl::string_view name, MetricType type) {
  const MetricDef* def = FindMetricDef(name);
  if (def == nullptr || def->type != type) {
    std::fprintf(stderr, "pdserve metrics: %s is not a catalogued %s\n",
                 std::string(name).c_str(), MetricTypeName(type));
    std::abort();
  }
  return *def;
}

}  // namespace

prometheus::Family<prometheus::Counter>& CounterFamily(
    prometheus::Registry& registry, absl::string_view name) {
  const MetricDef& def = DefOrDie(name, MetricType::kCounter);
  return prometheus::BuildCounter().Name(def.name).Help(def.help).Register(
      registry);
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(
    prometheus::Registry& registry, absl::string_view name) {
  const MetricDef& def = DefOrDie(name, MetricType::kGauge);
  return prometheus::BuildGauge().Name(def.name).Help(def.help).Register(
      registry);
}

prometheus::Family<prometheus::Histogram>& HistogramFamily(
    prometheus::Registry& registry, absl::string_view name) {
  const MetricDef& def = DefOrDie(name, MetricType::kHistogram);
  return prometheus::BuildHistogram().Name(def.name).Help(def.help).Register(
      registry);
}

}  // namespace pdserve::metrics
