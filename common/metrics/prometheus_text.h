// Parser of the Prometheus text exposition format (what /metrics serves), and
// ScrapeMetrics = HttpGet + parse, for tests that check what a process
// exports. PrometheusSamples is an immutable value once built: thread-safe
// for reading.
#ifndef PDSERVE_COMMON_METRICS_PROMETHEUS_TEXT_H_
#define PDSERVE_COMMON_METRICS_PROMETHEUS_TEXT_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pdserve::metrics {

using LabelSet = std::map<std::string, std::string>;

struct PrometheusSample {
  std::string name;  // series name as written, e.g. "x_bucket"
  LabelSet labels;
  double value = 0;
};

class PrometheusSamples {
 public:
  // "name{a=\"1\",b=\"2\"}" with labels sorted; "name" without labels.
  static std::string Key(absl::string_view name, const LabelSet& labels);

  // The value of the series with exactly these labels.
  std::optional<double> Get(absl::string_view name,
                            const LabelSet& labels = {}) const;
  // Sum over every series `name` whose labels include all of `match`.
  double Sum(absl::string_view name, const LabelSet& match = {}) const;
  // Families declared by "# TYPE name type" lines: name -> type.
  const std::map<std::string, std::string>& types() const { return types_; }
  const std::vector<PrometheusSample>& samples() const { return samples_; }
  const std::map<std::string, double>& by_key() const { return by_key_; }

 private:
  friend absl::StatusOr<PrometheusSamples> ParsePrometheusText(
      absl::string_view text);

  std::vector<PrometheusSample> samples_;
  std::map<std::string, double> by_key_;
  std::map<std::string, std::string> types_;
};

// Fails with INVALID_ARGUMENT (naming the line) on malformed input or a
// duplicate series.
absl::StatusOr<PrometheusSamples> ParsePrometheusText(absl::string_view text);

// GET http://host:port/metrics, require HTTP 200, parse.
absl::StatusOr<PrometheusSamples> ScrapeMetrics(
    absl::string_view host, int port,
    absl::Duration timeout = absl::Seconds(10));

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_PROMETHEUS_TEXT_H_
