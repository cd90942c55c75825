// Every metric name that the Grafana dashboard and the Prometheus rules use is
// defined by pdserve_metrics (the catalogue the bundles are built from), every
// recorded series they use is recorded, and label values they match on exist.
// Runs from the repository root (pdserve_add_test's working directory).
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metric_defs.h"
#include "common/metrics/stage_timings.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve::metrics {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> Matches(const std::string& text, const std::string& re,
                              int group = 0) {
  std::set<std::string> out;
  const std::regex r(re);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), r);
       it != std::sregex_iterator(); ++it) {
    out.insert((*it)[group].str());
  }
  return out;
}

// The catalogued metric a series name belongs to ("x_bucket" -> "x" when x
// is a histogram), or "" if none.
std::string FamilyOf(const std::string& series) {
  if (const MetricDef* def = FindMetricDef(series)) return def->name;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (absl::EndsWith(series, suffix)) {
      const std::string base =
          series.substr(0, series.size() - std::string(suffix).size());
      const MetricDef* def = FindMetricDef(base);
      if (def != nullptr && def->type == MetricType::kHistogram) return base;
    }
  }
  return "";
}

// Every expr of every panel of the dashboard.
std::vector<std::string> DashboardExprs(const nlohmann::json& dash) {
  std::vector<std::string> out;
  std::vector<const nlohmann::json*> stack = {&dash};
  while (!stack.empty()) {
    const nlohmann::json* j = stack.back();
    stack.pop_back();
    if (j->is_object()) {
      for (const auto& [k, v] : j->items()) {
        if (k == "expr" && v.is_string()) out.push_back(v.get<std::string>());
        stack.push_back(&v);
      }
    } else if (j->is_array()) {
      for (const auto& v : *j) stack.push_back(&v);
    }
  }
  return out;
}

// Checks one PromQL text: metric names, recorded names, label values.
void CheckPromQl(const std::string& where, const std::string& text,
                 const std::set<std::string>& recorded) {
  const std::set<std::string> names = Matches(text, "\\bpdserve_[a-zA-Z0-9_]+");
  for (const std::string& name : names) {
    EXPECT_NE(FamilyOf(name), "") << where << ": unknown metric " << name;
  }
  for (const std::string& name : Matches(text, "\\bpdserve:[a-zA-Z0-9_:]+")) {
    EXPECT_TRUE(recorded.count(name)) << where << ": not recorded: " << name;
  }
  for (const std::string& stage : Matches(text, "stage=\"([^\"]*)\"", 1)) {
    EXPECT_TRUE(StageFromName(stage).has_value()) << where << ": " << stage;
  }
  for (const std::string& role : Matches(text, "\\brole=\"([^\"]*)\"", 1)) {
    EXPECT_TRUE(role == "router" || role == "prefill" || role == "decode")
        << where << ": role " << role;
  }
  std::set<std::string> codes;
  for (int c = 0; c <= static_cast<int>(absl::StatusCode::kUnauthenticated);
       ++c) {
    codes.insert(absl::StatusCodeToString(static_cast<absl::StatusCode>(c)));
  }
  for (const std::string& code : Matches(text, "\\bcode=\"([^\"]*)\"", 1)) {
    EXPECT_TRUE(codes.count(code)) << where << ": code " << code;
  }
  for (const std::string& reason : Matches(text, "\\breason=\"([^\"]*)\"", 1)) {
    EXPECT_TRUE(codes.count(absl::AsciiStrToUpper(reason)))
        << where << ": reason " << reason;
  }
  // A `le` matcher must name a bucket bound that the histogram really has.
  for (const std::string& le : Matches(text, "\\ble=\"([^\"]*)\"", 1)) {
    bool found = le == "+Inf";
    for (double b : LatencyBuckets()) {
      std::ostringstream s;
      s << b;
      found = found || s.str() == le;
    }
    EXPECT_TRUE(found) << where << ": le=\"" << le << "\" is no bucket bound";
  }
}

std::set<std::string> RecordedNames() {
  return Matches(ReadFile("deploy/prometheus/rules/recording.yml"),
                 "record:\\s*(pdserve:[a-zA-Z0-9_:]+)", 1);
}

TEST(MetricNamesTest, DashboardUsesOnlyDefinedMetrics) {
  nlohmann::json dash;
  try {
    dash = nlohmann::json::parse(ReadFile("deploy/grafana/pdserve.json"));
  } catch (const nlohmann::json::exception& e) {
    FAIL() << "pdserve.json: " << e.what();
  }
  const std::vector<std::string> exprs = DashboardExprs(dash);
  ASSERT_GE(exprs.size(), 20u);
  const std::set<std::string> recorded = RecordedNames();
  std::set<std::string> used;
  for (const std::string& e : exprs) {
    CheckPromQl("dashboard", e, recorded);
    for (const std::string& n : Matches(e, "\\bpdserve_[a-zA-Z0-9_]+")) {
      used.insert(FamilyOf(n));
    }
  }
  // One row per stage of a request.
  std::set<std::string> rows;
  for (const auto& panel : dash["panels"]) {
    if (panel["type"] == "row") {
      rows.insert(absl::AsciiStrToLower(panel["title"].get<std::string>()));
    }
  }
  for (const char* stage : {"router", "prefill", "transfer", "decode"}) {
    bool found = false;
    for (const std::string& r : rows)
      found = found || absl::StrContains(r, stage);
    EXPECT_TRUE(found) << "no dashboard row for " << stage;
  }
  // The dashboard shows every metric pdserve exports (build_info aside).
  for (const MetricDef& def : AllMetricDefs()) {
    if (std::string(def.name) == "pdserve_build_info") continue;
    EXPECT_TRUE(used.count(def.name)) << "not on the dashboard: " << def.name;
  }
}

TEST(MetricNamesTest, RulesUseOnlyDefinedMetrics) {
  const std::set<std::string> recorded = RecordedNames();
  EXPECT_GE(recorded.size(), 6u);
  for (const char* path : {"deploy/prometheus/rules/recording.yml",
                           "deploy/prometheus/rules/alerts.yml"}) {
    const std::string text = ReadFile(path);
    EXPECT_FALSE(Matches(text, "\\bpdserve_[a-zA-Z0-9_]+").empty()) << path;
    CheckPromQl(path, text, recorded);
  }
}

TEST(MetricNamesTest, DocsDescribeEveryMetric) {
  const std::string doc = ReadFile("docs/observability.md");
  for (const MetricDef& def : AllMetricDefs()) {
    EXPECT_TRUE(absl::StrContains(doc, absl::StrCat("| `", def.name, "` |")))
        << "docs/observability.md has no table row for " << def.name;
  }
  for (const std::string& name : Matches(doc, "\\bpdserve_[a-zA-Z0-9_]+")) {
    EXPECT_NE(FamilyOf(name), "") << "docs mention unknown metric " << name;
  }
}

TEST(MetricNamesTest, CheckerCatchesUnknownNames) {
  // The checks above must be able to fail.
  EXPECT_EQ(FamilyOf("pdserve_time_to_first_token_seconds_bucket"),
            "pdserve_time_to_first_token_seconds");
  EXPECT_EQ(FamilyOf("pdserve_requests_total"), "pdserve_requests_total");
  EXPECT_EQ(FamilyOf("pdserve_requests_total_bucket"), "");
  EXPECT_EQ(FamilyOf("pdserve_time_to_first_token"), "");
}

}  // namespace
}  // namespace pdserve::metrics
