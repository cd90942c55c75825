#include "tools/loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"

namespace pdserve::loadgen {

std::optional<double> RequestRecord::TtftMs() const {
  if (chunks.empty()) return std::nullopt;
  return (chunks.front().t_s - sent_s) * 1e3;
}

std::optional<double> RequestRecord::E2eMs() const {
  return (end_s - sent_s) * 1e3;
}

std::optional<double> RequestRecord::TpotMs() const {
  if (output_tokens < 2) return std::nullopt;
  const std::optional<double> ttft = TtftMs();
  if (!ttft) return std::nullopt;
  return (*E2eMs() - *ttft) / (output_tokens - 1);
}

std::vector<double> RequestRecord::ItlMs() const {
  std::vector<double> gaps;
  for (size_t i = 1; i < chunks.size(); ++i) {
    gaps.push_back((chunks[i].t_s - chunks[i - 1].t_s) * 1e3);
  }
  return gaps;
}

StreamRecorder::StreamRecorder(int32_t index, double scheduled_s,
                               int32_t dataset_input_tokens, bool is_long) {
  record_.index = index;
  record_.scheduled_s = scheduled_s;
  record_.sent_s = scheduled_s;
  record_.input_tokens = dataset_input_tokens;
  record_.is_long = is_long;
}

void StreamRecorder::OnSent(double t_s) { record_.sent_s = t_s; }

void StreamRecorder::OnMessage(double t_s, int32_t num_tokens) {
  if (num_tokens <= 0) return;
  record_.chunks.push_back({t_s, num_tokens});
  record_.output_tokens += num_tokens;
}

void StreamRecorder::OnUsage(int32_t prompt_tokens, int32_t completion_tokens) {
  if (prompt_tokens > 0) record_.input_tokens = prompt_tokens;
  usage_completion_tokens_ = completion_tokens;
}

void StreamRecorder::ReconcileWithUsage() {
  if (usage_completion_tokens_ > record_.output_tokens &&
      !record_.chunks.empty()) {
    record_.chunks.back().tokens +=
        usage_completion_tokens_ - record_.output_tokens;
    record_.output_tokens = usage_completion_tokens_;
  }
}

void StreamRecorder::OnFinishReason(std::string reason) {
  record_.finish_reason = std::move(reason);
}

void StreamRecorder::OnStage(std::string stage, double seconds) {
  record_.stages.push_back({std::move(stage), seconds});
}

RequestRecord StreamRecorder::Finish(double t_s, int32_t status_code,
                                     std::string message) {
  record_.end_s = t_s;
  record_.status_code = status_code;
  record_.error_message = std::move(message);
  return std::move(record_);
}

bool MeetsSlo(const RequestRecord& r, const SloSpec& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_ms) {
    const std::optional<double> ttft = r.TtftMs();
    if (!ttft || *ttft > *slo.ttft_ms) return false;
  }
  if (slo.tpot_ms) {
    const std::optional<double> tpot = r.TpotMs();
    if (tpot && *tpot > *slo.tpot_ms) return false;
  }
  if (slo.e2e_ms && *r.E2eMs() > *slo.e2e_ms) return false;
  return true;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  p = std::clamp(p, 0.0, 100.0);
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = static_cast<size_t>(std::ceil(rank));
  return values[lo] +
         (rank - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

LatencySummary Summarize(const std::vector<double>& values) {
  LatencySummary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) /
           static_cast<double>(values.size());
  s.median = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p99 = Percentile(values, 99);
  s.max = *std::max_element(values.begin(), values.end());
  return s;
}

double RunDuration(const std::vector<RequestRecord>& records) {
  if (records.empty()) return 0.0;
  double first = records.front().sent_s, last = records.front().end_s;
  for (const RequestRecord& r : records) {
    first = std::min(first, r.sent_s);
    last = std::max(last, r.end_s);
  }
  return last - first;
}

std::string StatusCodeName(int32_t code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

BenchMetrics ComputeMetrics(const std::vector<RequestRecord>& records,
                            double duration_s, const SloSpec& slo) {
  BenchMetrics m;
  m.num_requests = static_cast<int32_t>(records.size());
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  std::map<std::string, std::vector<double>> stages;
  std::map<std::string, std::vector<double>> class_ttft, class_tpot;
  std::map<std::string, int32_t> class_completed;
  bool any_long = false;
  for (const RequestRecord& r : records) any_long |= r.is_long;
  for (const RequestRecord& r : records) {
    if (!r.ok()) {
      ++m.failed;
      ++m.errors_by_code[StatusCodeName(r.status_code)];
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.input_tokens;
    m.total_output_tokens += r.output_tokens;
    if (MeetsSlo(r, slo)) ++m.good_requests;
    if (auto v = r.TtftMs()) ttft.push_back(*v);
    if (auto v = r.TpotMs()) tpot.push_back(*v);
    if (auto v = r.E2eMs()) e2e.push_back(*v);
    for (double g : r.ItlMs()) itl.push_back(g);
    if (any_long) {
      const std::string cls = r.is_long ? "long" : "short";
      ++class_completed[cls];
      if (auto v = r.TtftMs()) class_ttft[cls].push_back(*v);
      if (auto v = r.TpotMs()) class_tpot[cls].push_back(*v);
    }
    for (const StageTiming& st : r.stages) {
      stages[st.stage].push_back(st.seconds * 1e3);
    }
  }
  if (duration_s > 0.0) {
    m.request_throughput = m.completed / duration_s;
    m.input_throughput = m.total_input_tokens / duration_s;
    m.output_throughput = m.total_output_tokens / duration_s;
    m.goodput = m.good_requests / duration_s;
  }
  if (m.num_requests > 0) {
    m.slo_attainment = static_cast<double>(m.good_requests) / m.num_requests;
  }
  m.ttft_ms = Summarize(ttft);
  m.tpot_ms = Summarize(tpot);
  m.itl_ms = Summarize(itl);
  m.e2e_ms = Summarize(e2e);
  for (const auto& [name, values] : stages) {
    m.stage_ms[name] = Summarize(values);
  }
  for (const auto& [cls, n] : class_completed) {
    m.by_class[cls] = {n, Summarize(class_ttft[cls]),
                       Summarize(class_tpot[cls])};
  }
  return m;
}

int PeakGoodputIndex(const std::vector<SweepPoint>& points) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(points.size()); ++i) {
    if (best < 0 || points[i].metrics.goodput > points[best].metrics.goodput ||
        (points[i].metrics.goodput == points[best].metrics.goodput &&
         points[i].request_rate < points[best].request_rate)) {
      best = i;
    }
  }
  return best;
}

}  // namespace pdserve::loadgen
