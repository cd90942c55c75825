// Rendering of benchmark results as text (the report, a side-by-side
// comparison, a sweep table, the live progress line) and as JSON (the full
// result, readable back for comparisons). Pure functions.
#ifndef PDSERVE_TOOLS_LOADGEN_REPORT_H_
#define PDSERVE_TOOLS_LOADGEN_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/loadgen/stats.h"

namespace pdserve::loadgen {

// How a run was configured (printed in the report and kept in the JSON).
struct RunInfo {
  std::string label;  // free-form, e.g. "disaggregated"
  std::string target;
  std::string dataset;
  int32_t num_prompts = 0;
  double request_rate = 0.0;  // requests/s; infinity = all at once
  double burstiness = 1.0;
  int32_t max_concurrency = 0;  // 0 = unlimited
  uint64_t seed = 0;
  SloSpec slo;
};

struct BenchResult {
  RunInfo info;
  std::vector<RequestRecord> records;
  BenchMetrics metrics;
};

// The human-readable report of one run.
std::string FormatReport(const BenchResult& result);

// Key figures of several runs side by side, one column per run.
std::string FormatComparison(const std::vector<BenchResult>& results);

// One row per rate; marks the rate with the peak goodput.
std::string FormatSweep(const std::vector<SweepPoint>& points,
                        const SloSpec& slo);

// Full result as JSON: run info, metrics and every request record.
std::string ResultToJson(const BenchResult& result);
// Reads ResultToJson's output back; metrics are recomputed from the records.
absl::StatusOr<BenchResult> ResultFromJson(const std::string& text);
// A sweep as JSON (label, SLO, rates, metrics per rate, peak).
std::string SweepToJson(const std::string& label,
                        const std::vector<SweepPoint>& points,
                        const SloSpec& slo);
struct SweepResult {
  std::string label;
  SloSpec slo;
  std::vector<SweepPoint> points;
};
// Reads SweepToJson's output back (the summary metrics plotted and printed
// by FormatSweep; per-request records are not kept in a sweep).
absl::StatusOr<SweepResult> SweepFromJson(const std::string& text);
// True when `text` parses as a sweep rather than a single run.
bool IsSweepJson(const std::string& text);

struct ProgressSnapshot {
  int32_t total = 0;
  int32_t done = 0;  // finished, with or without error
  int32_t failed = 0;
  int32_t in_flight = 0;
  int64_t output_tokens = 0;
  double elapsed_s = 0.0;
};
// One status line (no newline), e.g. for a carriage-return progress display.
std::string FormatProgress(const ProgressSnapshot& p);

// "inf" or the number with up to 3 decimals.
std::string FormatRate(double rate);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_TOOLS_LOADGEN_REPORT_H_
