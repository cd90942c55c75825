#include "tools/loadgen/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pdserve::loadgen {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#2ca02c", "#9467bd",
                                    "#8c564b", "#17becf", "#7f7f7f"};
const char* Color(size_t i) { return kPalette[i % 6]; }

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string TickLabel(double v) {
  if (v == 0) return "0";
  if (std::fabs(v) >= 100) return absl::StrFormat("%.0f", v);
  if (std::fabs(v) >= 1) return absl::StrFormat("%.3g", v);
  return absl::StrFormat("%.2g", v);
}

// A rectangular plot area mapping data coordinates to pixels.
struct Panel {
  double x0, y0, w, h;        // pixel box of the plot area
  double xmax = 1, ymax = 1;  // data ranges start at 0
  double X(double v) const { return x0 + w * std::clamp(v / xmax, 0.0, 1.0); }
  double Y(double v) const {
    return y0 + h - h * std::clamp(v / ymax, 0.0, 1.0);
  }
};

// Accumulates SVG elements and wraps them in a document. Not thread-safe
// (one plot is built by one thread).
class Svg {
 public:
  Svg(double width, double height) : width_(width), height_(height) {}

  void Text(double x, double y, const std::string& s, int size = 12,
            const std::string& anchor = "start",
            const std::string& extra = "") {
    absl::StrAppendFormat(&body_,
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" "
                          "text-anchor=\"%s\" %s>%s</text>\n",
                          x, y, size, anchor, extra, Escape(s));
  }
  void Line(double x1, double y1, double x2, double y2,
            const std::string& color, double width = 1,
            const std::string& extra = "") {
    absl::StrAppendFormat(
        &body_,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
        "stroke=\"%s\" stroke-width=\"%.2f\" %s/>\n",
        x1, y1, x2, y2, color, width, extra);
  }
  void Rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& extra = "") {
    absl::StrAppendFormat(&body_,
                          "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
                          "height=\"%.2f\" fill=\"%s\" %s/>\n",
                          x, y, std::max(w, 0.0), std::max(h, 0.0), fill,
                          extra);
  }
  void Polyline(const std::vector<std::pair<double, double>>& pts,
                const std::string& color, double width = 1.5,
                bool dashed = false) {
    if (pts.empty()) return;
    std::string p;
    for (const auto& [x, y] : pts)
      absl::StrAppendFormat(&p, "%.1f,%.1f ", x, y);
    absl::StrAppendFormat(&body_,
                          "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" "
                          "stroke-width=\"%.2f\"%s/>\n",
                          p, color, width,
                          dashed ? " stroke-dasharray=\"6,4\"" : "");
  }
  void Circle(double x, double y, double r, const std::string& color) {
    absl::StrAppendFormat(&body_,
                          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" "
                          "fill=\"%s\"/>\n",
                          x, y, r, color);
  }

  // Frame, grid and tick labels of a panel.
  void Axes(const Panel& p, const std::string& title, const std::string& xlabel,
            const std::string& ylabel) {
    Rect(p.x0, p.y0, p.w, p.h, "none", "stroke=\"#333\"");
    for (double t : NiceTicks(p.xmax, 6)) {
      Line(p.X(t), p.y0, p.X(t), p.y0 + p.h, "#ddd");
      Text(p.X(t), p.y0 + p.h + 14, TickLabel(t), 10, "middle");
    }
    for (double t : NiceTicks(p.ymax, 5)) {
      Line(p.x0, p.Y(t), p.x0 + p.w, p.Y(t), "#ddd");
      Text(p.x0 - 4, p.Y(t) + 3, TickLabel(t), 10, "end");
    }
    Text(p.x0 + p.w / 2, p.y0 - 8, title, 13, "middle", "font-weight=\"bold\"");
    Text(p.x0 + p.w / 2, p.y0 + p.h + 30, xlabel, 11, "middle");
    Text(p.x0 - 36, p.y0 + p.h / 2, ylabel, 11, "middle",
         absl::StrFormat("transform=\"rotate(-90 %.1f %.1f)\"", p.x0 - 36,
                         p.y0 + p.h / 2));
  }

  std::string Finish() const {
    return absl::StrFormat(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
        "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
        "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" "
        "fill=\"white\"/>\n%s</svg>\n",
        width_, height_, width_, height_, body_);
  }

 private:
  double width_, height_;
  std::string body_;
};

std::vector<double> Collect(
    const BenchResult& r,
    const std::function<void(const RequestRecord&, std::vector<double>*)>& f) {
  std::vector<double> v;
  for (const RequestRecord& rec : r.records) {
    if (rec.ok()) f(rec, &v);
  }
  std::sort(v.begin(), v.end());
  return v;
}

void CdfPanel(
    Svg& svg, Panel p, const std::vector<BenchResult>& runs,
    const std::string& title,
    const std::function<void(const RequestRecord&, std::vector<double>*)>& f) {
  std::vector<std::vector<double>> data;
  double xmax = 0, p99max = 0;
  for (const BenchResult& r : runs) {
    data.push_back(Collect(r, f));
    if (data.back().empty()) continue;
    xmax = std::max(xmax, data.back().back());
    p99max = std::max(p99max, Percentile(data.back(), 99));
  }
  // A far outlier would squeeze every curve into the left edge: clip the
  // axis at 1.5 x the largest p99 and say so (curves end on the border).
  std::string full_title = title;
  double xlimit = xmax;
  if (p99max > 0 && xmax > 2 * p99max) {
    xlimit = 1.5 * p99max;
    full_title = absl::StrFormat("%s (axis clipped; max %.0f ms)", title, xmax);
  }
  const std::vector<double> ticks = NiceTicks(xlimit > 0 ? xlimit : 1, 6);
  p.xmax = ticks.back();
  p.ymax = 1.0;
  svg.Axes(p, full_title, "ms", "fraction of requests");
  for (size_t i = 0; i < data.size(); ++i) {
    const std::vector<double>& v = data[i];
    if (v.empty()) continue;
    std::vector<std::pair<double, double>> pts;
    pts.emplace_back(p.X(v.front()), p.Y(0));
    // Empirical CDF as a step function, thinned to at most ~400 steps.
    const size_t step = std::max<size_t>(1, v.size() / 400);
    for (size_t k = 0; k < v.size(); k += step) {
      const double frac = static_cast<double>(k) / v.size();
      const double frac_next = static_cast<double>(k + 1) / v.size();
      pts.emplace_back(p.X(v[k]), p.Y(frac));
      pts.emplace_back(p.X(v[k]), p.Y(frac_next));
    }
    pts.emplace_back(p.X(v.back()), p.Y(1.0));
    svg.Polyline(pts, Color(i));
  }
}

void TimelinePanel(Svg& svg, Panel p, const BenchResult& r, double tmax) {
  p.xmax = tmax;
  p.ymax = std::max<double>(1, r.records.size());
  svg.Axes(p,
           absl::StrCat("Per-request timeline",
                        r.info.label.empty() ? "" : ": ", r.info.label),
           "seconds since start", "request");
  const double bar = p.h / p.ymax;
  const double gap = bar > 3 ? 0.15 * bar : 0;
  for (size_t k = 0; k < r.records.size(); ++k) {
    const RequestRecord& rec = r.records[k];
    // Request 0 at the bottom, matching the axis.
    const double y = p.Y(static_cast<double>(k + 1)) + gap / 2;
    const double h = bar - gap;
    svg.Rect(p.X(rec.scheduled_s), y, p.X(rec.sent_s) - p.X(rec.scheduled_s), h,
             "#bbbbbb");
    if (!rec.ok()) {
      svg.Rect(p.X(rec.sent_s), y, p.X(rec.end_s) - p.X(rec.sent_s), h,
               "#d62728");
      continue;
    }
    const double first =
        rec.chunks.empty() ? rec.end_s : rec.chunks.front().t_s;
    svg.Rect(p.X(rec.sent_s), y, p.X(first) - p.X(rec.sent_s), h,
             rec.is_long ? "#b35900" : "#ff9f40");
    svg.Rect(p.X(first), y, p.X(rec.end_s) - p.X(first), h, "#1f77b4");
  }
  // Legend, top left (bars rise from the bottom left to the top right).
  const double lx = p.x0 + 6, ly = p.y0 + 6;
  const std::pair<const char*, const char*> items[] = {
      {"#bbbbbb", "queued in bench (concurrency cap)"},
      {"#ff9f40", "sent -> 1st token"},
      {"#b35900", "sent -> 1st token (long prompt)"},
      {"#1f77b4", "1st token -> end"},
      {"#d62728", "failed"}};
  svg.Rect(lx - 3, ly - 3, 200, 5 * 14 + 4, "white",
           "fill-opacity=\"0.85\" stroke=\"#ccc\"");
  for (int i = 0; i < 5; ++i) {
    svg.Rect(lx, ly + i * 14, 10, 10, items[i].first);
    svg.Text(lx + 14, ly + i * 14 + 9, items[i].second, 10);
  }
}

}  // namespace

std::vector<double> NiceTicks(double max_value, int target_count) {
  if (!(max_value > 0) || !std::isfinite(max_value)) return {0.0, 1.0};
  const double raw = max_value / std::max(1, target_count);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m == 2.5 && mag >= 1.0) continue;  // keep whole-number steps whole
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (int i = 0;; ++i) {
    ticks.push_back(i * step);
    if (i * step >= max_value * (1 - 1e-9)) break;
  }
  return ticks;
}

std::string RenderBenchSvg(const std::vector<BenchResult>& runs) {
  const double width = 1000, cdf_h = 220, tl_h = 320;
  const double height = 60 + 2 * (cdf_h + 70) + runs.size() * (tl_h + 70);
  Svg svg(width, height);
  std::string title = "pdserve bench";
  for (size_t i = 0; i < runs.size(); ++i) {
    const BenchResult& r = runs[i];
    svg.Rect(20 + i * 260, 32, 12, 4, Color(i));
    svg.Text(36 + i * 260, 38,
             absl::StrFormat("%s (%s, rate %s, %d req)",
                             r.info.label.empty() ? "run" : r.info.label,
                             r.info.dataset, FormatRate(r.info.request_rate),
                             r.metrics.num_requests),
             11);
  }
  svg.Text(width / 2, 18, absl::StrCat(title, ": latency CDFs and timeline"),
           15, "middle", "font-weight=\"bold\"");
  const double pw = 400, left1 = 70, left2 = 570;
  auto panel = [&](double x, double y) { return Panel{x, y, pw, cdf_h}; };
  CdfPanel(svg, panel(left1, 70), runs, "TTFT CDF",
           [](const RequestRecord& r, std::vector<double>* v) {
             if (auto t = r.TtftMs()) v->push_back(*t);
           });
  CdfPanel(svg, panel(left2, 70), runs, "TPOT CDF",
           [](const RequestRecord& r, std::vector<double>* v) {
             if (auto t = r.TpotMs()) v->push_back(*t);
           });
  CdfPanel(svg, panel(left1, 70 + cdf_h + 70), runs, "ITL CDF",
           [](const RequestRecord& r, std::vector<double>* v) {
             for (double g : r.ItlMs()) v->push_back(g);
           });
  CdfPanel(svg, panel(left2, 70 + cdf_h + 70), runs, "E2E latency CDF",
           [](const RequestRecord& r, std::vector<double>* v) {
             if (auto t = r.E2eMs()) v->push_back(*t);
           });
  double tmax = 0;
  for (const BenchResult& r : runs) {
    for (const RequestRecord& rec : r.records) tmax = std::max(tmax, rec.end_s);
  }
  tmax = NiceTicks(tmax > 0 ? tmax : 1, 8).back();
  double y = 70 + 2 * (cdf_h + 70);
  for (const BenchResult& r : runs) {
    TimelinePanel(svg, Panel{left1, y, width - left1 - 30, tl_h}, r, tmax);
    y += tl_h + 70;
  }
  return svg.Finish();
}

std::string RenderSweepSvg(const std::vector<std::vector<SweepPoint>>& series,
                           const std::vector<std::string>& labels,
                           const SloSpec& slo) {
  Svg svg(760, 460);
  double xmax = 0, ymax = 0;
  for (const auto& s : series) {
    for (const SweepPoint& p : s) {
      if (std::isfinite(p.request_rate)) xmax = std::max(xmax, p.request_rate);
      ymax = std::max(ymax, p.metrics.goodput);
    }
  }
  Panel p{80, 60, 580, 320};
  p.xmax = NiceTicks(xmax > 0 ? xmax : 1, 6).back();
  p.ymax = NiceTicks(ymax > 0 ? ymax : 1, 5).back();
  std::string slo_text;
  if (slo.ttft_ms)
    absl::StrAppendFormat(&slo_text, " TTFT<=%.0fms", *slo.ttft_ms);
  if (slo.tpot_ms)
    absl::StrAppendFormat(&slo_text, " TPOT<=%.0fms", *slo.tpot_ms);
  if (slo.e2e_ms) absl::StrAppendFormat(&slo_text, " E2E<=%.0fms", *slo.e2e_ms);
  svg.Axes(p,
           absl::StrCat("Goodput and SLO attainment vs request rate",
                        slo_text.empty() ? "" : " (SLO:", slo_text,
                        slo_text.empty() ? "" : ")"),
           "offered request rate (req/s)", "goodput (req/s), solid");
  // Right axis: attainment 0..100 %.
  for (int pct = 0; pct <= 100; pct += 20) {
    const double yy = p.y0 + p.h - p.h * pct / 100.0;
    svg.Text(p.x0 + p.w + 4, yy + 3, absl::StrCat(pct, "%"), 10);
  }
  svg.Text(p.x0 + p.w + 40, p.y0 + p.h / 2, "SLO attainment, dashed", 11,
           "middle",
           absl::StrFormat("transform=\"rotate(90 %.1f %.1f)\"",
                           p.x0 + p.w + 40, p.y0 + p.h / 2));
  for (size_t i = 0; i < series.size(); ++i) {
    std::vector<std::pair<double, double>> good, attain;
    for (const SweepPoint& pt : series[i]) {
      if (!std::isfinite(pt.request_rate)) continue;
      good.emplace_back(p.X(pt.request_rate), p.Y(pt.metrics.goodput));
      attain.emplace_back(p.X(pt.request_rate),
                          p.y0 + p.h - p.h * pt.metrics.slo_attainment);
      svg.Circle(good.back().first, good.back().second, 3, Color(i));
    }
    svg.Polyline(good, Color(i), 2);
    svg.Polyline(attain, Color(i), 1.2, /*dashed=*/true);
    const int peak = PeakGoodputIndex(series[i]);
    if (peak >= 0 && std::isfinite(series[i][peak].request_rate) &&
        series[i][peak].metrics.goodput > 0) {
      const SweepPoint& pk = series[i][peak];
      svg.Circle(p.X(pk.request_rate), p.Y(pk.metrics.goodput), 6, Color(i));
      // Label on the side of the marker that has room.
      const bool right_half = p.X(pk.request_rate) > p.x0 + 0.6 * p.w;
      svg.Text(p.X(pk.request_rate) + (right_half ? -8 : 8),
               p.Y(pk.metrics.goodput) - 8,
               absl::StrFormat("peak %.2f req/s @ %s", pk.metrics.goodput,
                               FormatRate(pk.request_rate)),
               10, right_half ? "end" : "start");
    }
    svg.Rect(p.x0 + 10, p.y0 + p.h + 44 + 14 * i, 12, 4, Color(i));
    svg.Text(p.x0 + 26, p.y0 + p.h + 50 + 14 * i,
             i < labels.size() ? labels[i] : absl::StrCat("series ", i), 11);
  }
  return svg.Finish();
}

}  // namespace pdserve::loadgen
