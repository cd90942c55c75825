#include "common/metrics/prometheus_text.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics/http_get.h"

namespace pdserve::metrics {
namespace {

bool IsNameChar(char c, bool first) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' ||
         c == ':' ||
         (!first && absl::ascii_isdigit(static_cast<unsigned char>(c)));
}

absl::Status LineError(int line_no, absl::string_view line,
                       absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("metrics text line ", line_no, ": ", what, ": ", line));
}

absl::StatusOr<double> ParseValue(absl::string_view text) {
  if (text == "+Inf" || text == "Inf") {
    return std::numeric_limits<double>::infinity();
  }
  if (text == "-Inf") return -std::numeric_limits<double>::infinity();
  if (text == "NaN" || text == "Nan") {
    return std::numeric_limits<double>::quiet_NaN();
  }
  double v;
  if (!absl::SimpleAtod(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("bad value ", text));
  }
  return v;
}

// Parses `{a="x",b="y"}` starting at text[*pos] == '{'; leaves *pos after '}'.
absl::Status ParseLabels(absl::string_view text, size_t* pos,
                         LabelSet* labels) {
  size_t i = *pos + 1;
  while (true) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i >= text.size()) return absl::InvalidArgumentError("unclosed labels");
    if (text[i] == '}') {
      *pos = i + 1;
      return absl::OkStatus();
    }
    const size_t name_begin = i;
    while (i < text.size() && IsNameChar(text[i], i == name_begin)) ++i;
    const std::string name(text.substr(name_begin, i - name_begin));
    if (name.empty() || i + 1 >= text.size() || text[i] != '=' ||
        text[i + 1] != '"') {
      return absl::InvalidArgumentError("bad label");
    }
    i += 2;
    std::string value;
    while (i < text.size() && text[i] != '"') {
      if (text[i] == '\\' && i + 1 < text.size()) {
        const char e = text[i + 1];
        value.push_back(e == 'n' ? '\n' : e);
        i += 2;
      } else {
        value.push_back(text[i++]);
      }
    }
    if (i >= text.size()) return absl::InvalidArgumentError("unclosed value");
    ++i;  // closing quote
    if (!labels->emplace(name, std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate label ", name));
    }
  }
}

}  // namespace

std::string PrometheusSamples::Key(absl::string_view name,
                                   const LabelSet& labels) {
  std::string key(name);
  if (labels.empty()) return key;
  key += "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    absl::StrAppend(&key, first ? "" : ",", k, "=\"", v, "\"");
    first = false;
  }
  key += "}";
  return key;
}

std::optional<double> PrometheusSamples::Get(absl::string_view name,
                                             const LabelSet& labels) const {
  auto it = by_key_.find(Key(name, labels));
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

double PrometheusSamples::Sum(absl::string_view name,
                              const LabelSet& match) const {
  double total = 0;
  for (const PrometheusSample& s : samples_) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) {
        ok = false;
        break;
      }
    }
    if (ok) total += s.value;
  }
  return total;
}

absl::StatusOr<PrometheusSamples> ParsePrometheusText(absl::string_view text) {
  PrometheusSamples out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::vector<absl::string_view> f =
          absl::StrSplit(line, absl::MaxSplits(' ', 3), absl::SkipEmpty());
      if (f.size() >= 4 && f[1] == "TYPE") {
        out.types_[std::string(f[2])] = std::string(f[3]);
      }
      continue;
    }
    PrometheusSample sample;
    size_t i = 0;
    while (i < line.size() && IsNameChar(line[i], i == 0)) ++i;
    if (i == 0) return LineError(line_no, line, "no metric name");
    sample.name = std::string(line.substr(0, i));
    if (i < line.size() && line[i] == '{') {
      absl::Status st = ParseLabels(line, &i, &sample.labels);
      if (!st.ok()) return LineError(line_no, line, st.message());
    }
    std::vector<absl::string_view> rest = absl::StrSplit(
        line.substr(i), absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (rest.empty() || rest.size() > 2) {
      return LineError(line_no, line, "expected value [timestamp]");
    }
    absl::StatusOr<double> value = ParseValue(rest[0]);
    if (!value.ok()) return LineError(line_no, line, value.status().message());
    sample.value = *value;
    const std::string key = PrometheusSamples::Key(sample.name, sample.labels);
    if (!out.by_key_.emplace(key, sample.value).second) {
      return LineError(line_no, line, "duplicate series");
    }
    out.samples_.push_back(std::move(sample));
  }
  return out;
}

absl::StatusOr<PrometheusSamples> ScrapeMetrics(absl::string_view host,
                                                int port,
                                                absl::Duration timeout) {
  absl::StatusOr<HttpResponse> response =
      HttpGet(host, port, "/metrics", timeout);
  if (!response.ok()) return response.status();
  if (response->status != 200) {
    return absl::UnavailableError(absl::StrCat(
        "GET http://", host, ":", port, "/metrics: HTTP ", response->status));
  }
  return ParsePrometheusText(response->body);
}

}  // namespace pdserve::metrics
