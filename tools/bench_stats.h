// Small helpers the benchmark subcommands share (bench-engine,
// bench-kv-transfer): medians over rounds and a monotonic clock.
// Header-only; thread-safe.
#ifndef PDSERVE_TOOLS_BENCH_STATS_H_
#define PDSERVE_TOOLS_BENCH_STATS_H_

#include <algorithm>
#include <chrono>
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

// Seconds on the steady clock (for intervals).
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_BENCH_STATS_H_
