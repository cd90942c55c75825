// SVG plots written by `pdserve bench` itself (no plotting tool needed):
// latency CDFs with a per-request timeline, and the goodput / SLO-attainment
// curve of a request-rate sweep. Pure functions returning SVG documents.
#ifndef PDSERVE_TOOLS_LOADGEN_SVG_PLOT_H_
#define PDSERVE_TOOLS_LOADGEN_SVG_PLOT_H_

#include <string>
#include <vector>

#include "tools/loadgen/report.h"
#include "tools/loadgen/stats.h"

namespace pdserve::loadgen {

// Four CDF panels (TTFT, TPOT, ITL, E2E; one curve per run, labelled by
// RunInfo::label) and, per run, a timeline with one horizontal bar per
// request: grey from arrival to send (waiting for a concurrency slot), orange
// from send to first token, blue from first token to the end; failed
// requests in red.
std::string RenderBenchSvg(const std::vector<BenchResult>& runs);

// Goodput (req/s, left axis) and SLO attainment (%, right axis) against the
// offered request rate, one curve per series; the peak-goodput point of each
// series is marked. `labels[i]` names `series[i]`.
std::string RenderSweepSvg(const std::vector<std::vector<SweepPoint>>& series,
                           const std::vector<std::string>& labels,
                           const SloSpec& slo);

// Helper exposed for tests: "nice" axis ticks covering [0, max_value].
std::vector<double> NiceTicks(double max_value, int target_count);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_TOOLS_LOADGEN_SVG_PLOT_H_
