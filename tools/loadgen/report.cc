#include "tools/loadgen/report.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace pdserve::loadgen {
namespace {

using nlohmann::json;

std::string Line(const std::string& name, const std::string& value) {
  return absl::StrFormat("%-34s %s\n", name, value);
}
std::string Num(double v, int decimals = 2) {
  return absl::StrFormat("%.*f", decimals, v);
}

void AppendLatency(std::string* out, const std::string& name,
                   const LatencySummary& s) {
  absl::StrAppend(out, Line(absl::StrCat("Mean ", name, " (ms):"), Num(s.mean)),
                  Line(absl::StrCat("Median ", name, " (ms):"), Num(s.median)),
                  Line(absl::StrCat("P90 ", name, " (ms):"), Num(s.p90)),
                  Line(absl::StrCat("P99 ", name, " (ms):"), Num(s.p99)));
}

std::string SloText(const SloSpec& slo) {
  if (!slo.any()) return "none (every completed request counts)";
  std::string s;
  if (slo.ttft_ms) absl::StrAppend(&s, "TTFT<=", Num(*slo.ttft_ms, 0), "ms ");
  if (slo.tpot_ms) absl::StrAppend(&s, "TPOT<=", Num(*slo.tpot_ms, 0), "ms ");
  if (slo.e2e_ms) absl::StrAppend(&s, "E2E<=", Num(*slo.e2e_ms, 0), "ms ");
  s.pop_back();
  return s;
}

json SummaryJson(const LatencySummary& s) {
  return json{{"count", s.count}, {"mean", s.mean}, {"median", s.median},
              {"p90", s.p90},     {"p99", s.p99},   {"max", s.max}};
}

json RateJson(double rate) {
  if (std::isinf(rate)) return "inf";
  return rate;
}
double RateFromJson(const json& j) {
  if (j.is_string()) return std::numeric_limits<double>::infinity();
  return j.get<double>();
}

json SloJson(const SloSpec& slo) {
  json j = json::object();
  if (slo.ttft_ms) j["ttft_ms"] = *slo.ttft_ms;
  if (slo.tpot_ms) j["tpot_ms"] = *slo.tpot_ms;
  if (slo.e2e_ms) j["e2e_ms"] = *slo.e2e_ms;
  return j;
}
SloSpec SloFromJson(const json& j) {
  SloSpec slo;
  if (j.contains("ttft_ms")) slo.ttft_ms = j.at("ttft_ms").get<double>();
  if (j.contains("tpot_ms")) slo.tpot_ms = j.at("tpot_ms").get<double>();
  if (j.contains("e2e_ms")) slo.e2e_ms = j.at("e2e_ms").get<double>();
  return slo;
}

json MetricsJson(const BenchMetrics& m) {
  json stages = json::object();
  for (const auto& [name, s] : m.stage_ms) stages[name] = SummaryJson(s);
  json classes = json::object();
  for (const auto& [name, c] : m.by_class) {
    classes[name] = {{"completed", c.completed},
                     {"ttft_ms", SummaryJson(c.ttft_ms)},
                     {"tpot_ms", SummaryJson(c.tpot_ms)}};
  }
  return json{{"num_requests", m.num_requests},
              {"completed", m.completed},
              {"failed", m.failed},
              {"duration_s", m.duration_s},
              {"total_input_tokens", m.total_input_tokens},
              {"total_output_tokens", m.total_output_tokens},
              {"request_throughput", m.request_throughput},
              {"input_throughput", m.input_throughput},
              {"output_throughput", m.output_throughput},
              {"good_requests", m.good_requests},
              {"goodput", m.goodput},
              {"slo_attainment", m.slo_attainment},
              {"ttft_ms", SummaryJson(m.ttft_ms)},
              {"tpot_ms", SummaryJson(m.tpot_ms)},
              {"itl_ms", SummaryJson(m.itl_ms)},
              {"e2e_ms", SummaryJson(m.e2e_ms)},
              {"errors_by_code", m.errors_by_code},
              {"stage_ms", stages},
              {"by_class", classes}};
}

LatencySummary SummaryFromJson(const json& j) {
  LatencySummary s;
  s.count = j.at("count").get<int64_t>();
  s.mean = j.at("mean").get<double>();
  s.median = j.at("median").get<double>();
  s.p90 = j.at("p90").get<double>();
  s.p99 = j.at("p99").get<double>();
  s.max = j.at("max").get<double>();
  return s;
}

BenchMetrics MetricsFromJson(const json& j) {
  BenchMetrics m;
  m.num_requests = j.at("num_requests").get<int32_t>();
  m.completed = j.at("completed").get<int32_t>();
  m.failed = j.at("failed").get<int32_t>();
  m.duration_s = j.at("duration_s").get<double>();
  m.total_input_tokens = j.at("total_input_tokens").get<int64_t>();
  m.total_output_tokens = j.at("total_output_tokens").get<int64_t>();
  m.request_throughput = j.at("request_throughput").get<double>();
  m.input_throughput = j.at("input_throughput").get<double>();
  m.output_throughput = j.at("output_throughput").get<double>();
  m.good_requests = j.at("good_requests").get<int32_t>();
  m.goodput = j.at("goodput").get<double>();
  m.slo_attainment = j.at("slo_attainment").get<double>();
  m.ttft_ms = SummaryFromJson(j.at("ttft_ms"));
  m.tpot_ms = SummaryFromJson(j.at("tpot_ms"));
  m.itl_ms = SummaryFromJson(j.at("itl_ms"));
  m.e2e_ms = SummaryFromJson(j.at("e2e_ms"));
  m.errors_by_code =
      j.at("errors_by_code").get<std::map<std::string, int32_t>>();
  for (const auto& [name, s] : j.at("stage_ms").items()) {
    m.stage_ms[name] = SummaryFromJson(s);
  }
  if (j.contains("by_class")) {
    for (const auto& [name, c] : j.at("by_class").items()) {
      m.by_class[name] = {c.at("completed").get<int32_t>(),
                          SummaryFromJson(c.at("ttft_ms")),
                          SummaryFromJson(c.at("tpot_ms"))};
    }
  }
  return m;
}

}  // namespace

std::string FormatRate(double rate) {
  if (std::isinf(rate)) return "inf";
  std::string s = absl::StrFormat("%.3f", rate);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string FormatReport(const BenchResult& r) {
  const BenchMetrics& m = r.metrics;
  std::string out = "============ pdserve bench result ============\n";
  if (!r.info.label.empty()) absl::StrAppend(&out, Line("Run:", r.info.label));
  absl::StrAppend(
      &out, Line("Target:", r.info.target), Line("Dataset:", r.info.dataset),
      Line("Request rate (req/s):", FormatRate(r.info.request_rate)),
      Line("Burstiness:", Num(r.info.burstiness)),
      Line("Max concurrency:", r.info.max_concurrency > 0
                                   ? absl::StrCat(r.info.max_concurrency)
                                   : std::string("unlimited")),
      Line("SLO:", SloText(r.info.slo)));
  absl::StrAppend(
      &out,
      Line("Requests (ok/failed/total):",
           absl::StrCat(m.completed, "/", m.failed, "/", m.num_requests)),
      Line("Benchmark duration (s):", Num(m.duration_s)),
      Line("Total input tokens:", absl::StrCat(m.total_input_tokens)),
      Line("Total output tokens:", absl::StrCat(m.total_output_tokens)),
      Line("Request throughput (req/s):", Num(m.request_throughput)),
      Line("Input token throughput (tok/s):", Num(m.input_throughput)),
      Line("Output token throughput (tok/s):", Num(m.output_throughput)),
      Line("Good requests:", absl::StrCat(m.good_requests)),
      Line("Goodput (req/s):", Num(m.goodput)),
      Line("SLO attainment (%):", Num(100.0 * m.slo_attainment)));
  absl::StrAppend(&out, "---------------Time to First Token-------------\n");
  AppendLatency(&out, "TTFT", m.ttft_ms);
  absl::StrAppend(&out, "-----Time per Output Token (excl. 1st token)---\n");
  AppendLatency(&out, "TPOT", m.tpot_ms);
  absl::StrAppend(&out, "---------------Inter-token Latency-------------\n");
  AppendLatency(&out, "ITL", m.itl_ms);
  absl::StrAppend(&out, "----------------End-to-end Latency-------------\n");
  AppendLatency(&out, "E2E", m.e2e_ms);
  if (!m.by_class.empty()) {
    absl::StrAppend(&out, "----Short vs long prompts (ms, p50 / p99)------\n");
    for (const auto& [name, c] : m.by_class) {
      absl::StrAppend(
          &out,
          Line(absl::StrCat(name, " (", c.completed, " ok) TTFT:"),
               absl::StrCat(Num(c.ttft_ms.median), " / ", Num(c.ttft_ms.p99))),
          Line(absl::StrCat(name, " TPOT:"),
               absl::StrCat(Num(c.tpot_ms.median), " / ", Num(c.tpot_ms.p99))));
    }
  }
  if (!m.stage_ms.empty()) {
    absl::StrAppend(&out, "------Server stage timings (ms, mean/p50/p99)---\n");
    for (const auto& [name, s] : m.stage_ms) {
      absl::StrAppend(&out, Line(absl::StrCat(name, ":"),
                                 absl::StrCat(Num(s.mean), " / ", Num(s.median),
                                              " / ", Num(s.p99))));
    }
  }
  if (!m.errors_by_code.empty()) {
    absl::StrAppend(&out, "--------------------Errors---------------------\n");
    for (const auto& [code, n] : m.errors_by_code) {
      absl::StrAppend(&out, Line(absl::StrCat(code, ":"), absl::StrCat(n)));
    }
  }
  absl::StrAppend(&out, "===============================================\n");
  return out;
}

std::string FormatComparison(const std::vector<BenchResult>& results) {
  std::string out = absl::StrFormat("%-28s", "");
  for (const BenchResult& r : results) {
    absl::StrAppend(&out, absl::StrFormat(" %16s", r.info.label.substr(0, 16)));
  }
  absl::StrAppend(&out, "\n");
  auto row = [&](const std::string& name, auto getter) {
    absl::StrAppend(&out, absl::StrFormat("%-28s", name));
    for (const BenchResult& r : results) {
      absl::StrAppend(&out, absl::StrFormat(" %16.2f", getter(r.metrics)));
    }
    absl::StrAppend(&out, "\n");
  };
  row("requests ok", [](const BenchMetrics& m) { return 1.0 * m.completed; });
  row("requests failed", [](const BenchMetrics& m) { return 1.0 * m.failed; });
  row("duration (s)", [](const BenchMetrics& m) { return m.duration_s; });
  row("request throughput (req/s)",
      [](const BenchMetrics& m) { return m.request_throughput; });
  row("output tokens/s",
      [](const BenchMetrics& m) { return m.output_throughput; });
  row("goodput (req/s)", [](const BenchMetrics& m) { return m.goodput; });
  row("SLO attainment (%)",
      [](const BenchMetrics& m) { return 100.0 * m.slo_attainment; });
  row("TTFT p50 (ms)", [](const BenchMetrics& m) { return m.ttft_ms.median; });
  row("TTFT p99 (ms)", [](const BenchMetrics& m) { return m.ttft_ms.p99; });
  row("TPOT p50 (ms)", [](const BenchMetrics& m) { return m.tpot_ms.median; });
  row("TPOT p99 (ms)", [](const BenchMetrics& m) { return m.tpot_ms.p99; });
  row("ITL p50 (ms)", [](const BenchMetrics& m) { return m.itl_ms.median; });
  row("ITL p99 (ms)", [](const BenchMetrics& m) { return m.itl_ms.p99; });
  row("E2E p50 (ms)", [](const BenchMetrics& m) { return m.e2e_ms.median; });
  row("E2E p99 (ms)", [](const BenchMetrics& m) { return m.e2e_ms.p99; });
  bool classes = false;
  for (const BenchResult& r : results) classes |= !r.metrics.by_class.empty();
  if (classes) {
    auto cls = [](const BenchMetrics& m, const std::string& name) {
      auto it = m.by_class.find(name);
      return it == m.by_class.end() ? ClassLatency{} : it->second;
    };
    row("short-prompt TTFT p50 (ms)",
        [&](const BenchMetrics& m) { return cls(m, "short").ttft_ms.median; });
    row("short-prompt TPOT p50 (ms)",
        [&](const BenchMetrics& m) { return cls(m, "short").tpot_ms.median; });
    row("short-prompt TPOT p99 (ms)",
        [&](const BenchMetrics& m) { return cls(m, "short").tpot_ms.p99; });
    row("long-prompt TTFT p50 (ms)",
        [&](const BenchMetrics& m) { return cls(m, "long").ttft_ms.median; });
    row("long-prompt TPOT p99 (ms)",
        [&](const BenchMetrics& m) { return cls(m, "long").tpot_ms.p99; });
  }
  return out;
}

std::string FormatSweep(const std::vector<SweepPoint>& points,
                        const SloSpec& slo) {
  std::string out =
      absl::StrFormat("SLO: %s\n%10s %10s %10s %10s %12s %12s %12s %7s\n",
                      SloText(slo), "rate", "req/s", "goodput", "attain%",
                      "TTFT p99", "TPOT p99", "E2E p99", "errors");
  int peak = PeakGoodputIndex(points);
  if (peak >= 0 && points[peak].metrics.goodput <= 0.0) peak = -1;
  for (int i = 0; i < static_cast<int>(points.size()); ++i) {
    const BenchMetrics& m = points[i].metrics;
    absl::StrAppend(
        &out, absl::StrFormat("%10s %10.2f %10.2f %10.1f %12.1f %12.1f %12.1f "
                              "%7d%s\n",
                              FormatRate(points[i].request_rate),
                              m.request_throughput, m.goodput,
                              100.0 * m.slo_attainment, m.ttft_ms.p99,
                              m.tpot_ms.p99, m.e2e_ms.p99, m.failed,
                              i == peak ? "  <- peak goodput" : ""));
  }
  if (peak < 0) {
    absl::StrAppend(&out, "No request met the SLO at any rate\n");
  } else {
    absl::StrAppend(&out, "Peak goodput ", Num(points[peak].metrics.goodput),
                    " req/s at request rate ",
                    FormatRate(points[peak].request_rate), " req/s\n");
  }
  return out;
}

std::string ResultToJson(const BenchResult& r) {
  json records = json::array();
  for (const RequestRecord& rec : r.records) {
    json chunks = json::array();
    for (const TokenChunk& c : rec.chunks) chunks.push_back({c.t_s, c.tokens});
    json stages = json::object();
    for (const StageTiming& st : rec.stages) stages[st.stage] = st.seconds;
    json jr = {{"index", rec.index},
               {"scheduled_s", rec.scheduled_s},
               {"sent_s", rec.sent_s},
               {"end_s", rec.end_s},
               {"input_tokens", rec.input_tokens},
               {"output_tokens", rec.output_tokens},
               {"status_code", rec.status_code},
               {"status", StatusCodeName(rec.status_code)},
               {"error_message", rec.error_message},
               {"finish_reason", rec.finish_reason},
               {"is_long", rec.is_long},
               {"chunks", chunks},
               {"stages_s", stages}};
    if (auto v = rec.TtftMs()) jr["ttft_ms"] = *v;
    if (auto v = rec.TpotMs()) jr["tpot_ms"] = *v;
    jr["e2e_ms"] = *rec.E2eMs();
    records.push_back(std::move(jr));
  }
  const RunInfo& i = r.info;
  json j = {{"info",
             {{"label", i.label},
              {"target", i.target},
              {"dataset", i.dataset},
              {"num_prompts", i.num_prompts},
              {"request_rate", RateJson(i.request_rate)},
              {"burstiness", i.burstiness},
              {"max_concurrency", i.max_concurrency},
              {"seed", i.seed},
              {"slo", SloJson(i.slo)}}},
            {"metrics", MetricsJson(r.metrics)},
            {"requests", records}};
  return j.dump(1);
}

absl::StatusOr<BenchResult> ResultFromJson(const std::string& text) {
  BenchResult r;
  try {
    const json j = json::parse(text);
    const json& i = j.at("info");
    r.info.label = i.at("label").get<std::string>();
    r.info.target = i.at("target").get<std::string>();
    r.info.dataset = i.at("dataset").get<std::string>();
    r.info.num_prompts = i.at("num_prompts").get<int32_t>();
    r.info.request_rate = RateFromJson(i.at("request_rate"));
    r.info.burstiness = i.at("burstiness").get<double>();
    r.info.max_concurrency = i.at("max_concurrency").get<int32_t>();
    r.info.seed = i.at("seed").get<uint64_t>();
    r.info.slo = SloFromJson(i.at("slo"));
    for (const json& jr : j.at("requests")) {
      RequestRecord rec;
      rec.index = jr.at("index").get<int32_t>();
      rec.scheduled_s = jr.at("scheduled_s").get<double>();
      rec.sent_s = jr.at("sent_s").get<double>();
      rec.end_s = jr.at("end_s").get<double>();
      rec.input_tokens = jr.at("input_tokens").get<int32_t>();
      rec.output_tokens = jr.at("output_tokens").get<int32_t>();
      rec.status_code = jr.at("status_code").get<int32_t>();
      rec.error_message = jr.at("error_message").get<std::string>();
      rec.finish_reason = jr.at("finish_reason").get<std::string>();
      rec.is_long = jr.at("is_long").get<bool>();
      for (const json& c : jr.at("chunks")) {
        rec.chunks.push_back({c.at(0).get<double>(), c.at(1).get<int32_t>()});
      }
      for (const auto& [stage, seconds] : jr.at("stages_s").items()) {
        rec.stages.push_back({stage, seconds.get<double>()});
      }
      r.records.push_back(std::move(rec));
    }
    r.metrics = ComputeMetrics(
        r.records, j.at("metrics").at("duration_s").get<double>(), r.info.slo);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a pdserve bench result: ", e.what()));
  }
  return r;
}

std::string SweepToJson(const std::string& label,
                        const std::vector<SweepPoint>& points,
                        const SloSpec& slo) {
  json rows = json::array();
  for (const SweepPoint& p : points) {
    rows.push_back({{"request_rate", RateJson(p.request_rate)},
                    {"metrics", MetricsJson(p.metrics)}});
  }
  const int peak = PeakGoodputIndex(points);
  json j = {{"label", label}, {"slo", SloJson(slo)}, {"points", rows}};
  if (peak >= 0) {
    j["peak_request_rate"] = RateJson(points[peak].request_rate);
    j["peak_goodput"] = points[peak].metrics.goodput;
  }
  return j.dump(1);
}

absl::StatusOr<SweepResult> SweepFromJson(const std::string& text) {
  SweepResult r;
  try {
    const json j = json::parse(text);
    r.label = j.at("label").get<std::string>();
    r.slo = SloFromJson(j.at("slo"));
    for (const json& p : j.at("points")) {
      r.points.push_back({RateFromJson(p.at("request_rate")),
                          MetricsFromJson(p.at("metrics"))});
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a pdserve bench sweep: ", e.what()));
  }
  return r;
}

bool IsSweepJson(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("points");
}

std::string FormatProgress(const ProgressSnapshot& p) {
  return absl::StrFormat(
      "[bench] %d/%d done, %d in flight, %d failed, %.1f s, %.1f out tok/s",
      p.done, p.total, p.in_flight, p.failed, p.elapsed_s,
      p.elapsed_s > 0 ? p.output_tokens / p.elapsed_s : 0.0);
}

}  // namespace pdserve::loadgen
