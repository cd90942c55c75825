// Small statistics the benchmark subcommands share (bench-engine,
// bench-kv-transfer): medians over rounds. Header-only; pure functions.
#ifndef PDSERVE_TOOLS_BENCH_STATS_H_
#define PDSERVE_TOOLS_BENCH_STATS_H_

#include <algorithm>
#include <vector>

namespace pdserve {

// The median of `v` (the mean of the middle two for an even count); 0 for
// none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_BENCH_STATS_H_
