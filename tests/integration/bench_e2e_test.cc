// End to end: `pdserve up` (stories260K, disaggregated and colocated), then
// `pdserve bench` as a separate process; the JSON result must count exactly
// the requests and tokens sent, with no errors. Also a 2-rate sweep and the
// --compare mode over the two runs. No timing assertions.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/scoped_env.h"
#include "common/util/subprocess.h"
#include "gtest/gtest.h"
#include "tools/loadgen/report.h"

namespace pdserve {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A `pdserve up` cluster for one test; stopped (SIGTERM, then SIGKILL) by the
// destructor, also when an assertion fails.
class Cluster {
 public:
  ~Cluster() {
    if (up_.running()) up_.Stop(absl::Seconds(20));
  }

  // Starts the cluster and waits until `up` prints the router address. The
  // router binds a free port itself (--port=0): a port picked here could be
  // taken by a parallel test before the router binds it.
  void Start(const std::string& dir, const std::vector<std::string>& flags) {
    stdout_path_ = dir + "/up.out";
    std::vector<std::string> argv = {PDSERVE_BINARY, "up",
                                     "--model=models/stories260K", "--port=0",
                                     "--http_port=-1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    SubprocessOptions opts;
    opts.stdout_path = stdout_path_;
    opts.stderr_path = dir + "/up.err";
    ScopedEnv tmpdir("TMPDIR", dir);  // up's log folder goes there
    auto up = Subprocess::Start(argv, opts);
    ASSERT_TRUE(up.ok()) << up.status();
    up_ = *std::move(up);
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (ReadFile(stdout_path_).find("ready") == std::string::npos) {
      ASSERT_TRUE(up_.running() && !up_.Poll().has_value())
          << "pdserve up exited: " << ReadFile(dir + "/up.err");
      ASSERT_LT(absl::Now(), deadline) << "pdserve up not ready";
      absl::SleepFor(absl::Milliseconds(50));
    }
    const std::string out = ReadFile(stdout_path_);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(
        out, m, std::regex("router listening on (127\\.0\\.0\\.1:[0-9]+)")))
        << out;
    target_ = m[1];
  }
  const std::string& target() const { return target_; }

 private:
  Subprocess up_;
  std::string target_;
  std::string stdout_path_;
};

// Runs `pdserve bench` with `flags`; returns its exit status (raw wait
// status), stdout in *out.
int RunBench(const std::string& dir, const std::string& name,
             const std::vector<std::string>& flags, std::string* out) {
  std::vector<std::string> argv = {PDSERVE_BINARY, "bench", "--progress=false"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  SubprocessOptions opts;
  opts.stdout_path = absl::StrCat(dir, "/", name, ".out");
  opts.stderr_path = absl::StrCat(dir, "/", name, ".err");
  auto proc = Subprocess::Start(argv, opts);
  if (!proc.ok()) return -1;
  auto status = proc->Wait(absl::Seconds(120));
  if (!status.ok()) return -1;
  *out = ReadFile(opts.stdout_path) + ReadFile(opts.stderr_path);
  return *status;
}

class BenchE2eTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pdserve-bench-e2e-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);  // kept for debugging
  }
  std::string dir_;
};

TEST_P(BenchE2eTest, ReportCountsRequestsAndTokens) {
  const std::string mode = GetParam();
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start(
      dir_, {absl::StrCat("--mode=", mode), "--threads=1", "--decode=1",
             mode == "colocated" ? "--prefill=0" : "--prefill=1"}));

  // 1. A fixed dataset: 12 requests x (16 prompt, 8 output) tokens, 4 at a
  //    time, Poisson arrivals at 50 req/s.
  const std::string json = dir_ + "/fixed.json";
  const std::string svg = dir_ + "/fixed.svg";
  std::string out;
  ASSERT_EQ(
      RunBench(
          dir_, "fixed",
          {absl::StrCat("--target=", cluster.target()), "--dataset=fixed",
           "--num_prompts=12", "--input_len=16", "--output_len=8",
           "--request_rate=50", "--max_concurrency=4", "--slo_ttft_ms=60000",
           absl::StrCat("--run_label=", mode),
           absl::StrCat("--json_out=", json), absl::StrCat("--plot=", svg)},
          &out),
      0)
      << out;
  EXPECT_NE(out.find("Requests (ok/failed/total):        12/0/12"),
            std::string::npos)
      << out;
  auto result = loadgen::ResultFromJson(ReadFile(json));
  ASSERT_TRUE(result.ok()) << result.status();
  const loadgen::BenchMetrics& m = result->metrics;
  EXPECT_EQ(m.num_requests, 12);
  EXPECT_EQ(m.completed, 12);
  EXPECT_EQ(m.failed, 0);
  EXPECT_TRUE(m.errors_by_code.empty());
  EXPECT_EQ(m.total_input_tokens, 12 * 16);  // as reported by the server
  EXPECT_EQ(m.total_output_tokens, 12 * 8);
  EXPECT_EQ(m.ttft_ms.count, 12);
  EXPECT_EQ(m.tpot_ms.count, 12);
  for (const loadgen::RequestRecord& r : result->records) {
    EXPECT_EQ(r.output_tokens, 8) << "request " << r.index;
    EXPECT_EQ(r.input_tokens, 16) << "request " << r.index;
    EXPECT_EQ(r.finish_reason, "length") << "request " << r.index;
    EXPECT_FALSE(r.stages.empty()) << "request " << r.index;
  }
  EXPECT_EQ(ReadFile(svg).rfind("<svg", 0), 0u);

  // 2. Text prompts from a JSONL file (tokenized by the router).
  const std::string dataset = dir_ + "/prompts.jsonl";
  std::ofstream(dataset)
      << "{\"prompt\": \"Once upon a time\", \"max_tokens\": 5}\n"
      << "{\"prompt\": \"The cat sat\", \"max_tokens\": 3}\n";
  const std::string json2 = dir_ + "/file.json";
  ASSERT_EQ(RunBench(dir_, "file",
                     {absl::StrCat("--target=", cluster.target()),
                      absl::StrCat("--dataset_file=", dataset),
                      "--num_prompts=4", absl::StrCat("--json_out=", json2)},
                     &out),
            0)
      << out;
  auto file_result = loadgen::ResultFromJson(ReadFile(json2));
  ASSERT_TRUE(file_result.ok()) << file_result.status();
  EXPECT_EQ(file_result->metrics.completed, 4);
  EXPECT_EQ(file_result->metrics.total_output_tokens, 5 + 3 + 5 + 3);
  for (const loadgen::RequestRecord& r : file_result->records) {
    EXPECT_GT(r.input_tokens, 0);  // known only from the server's usage
  }

  // 3. A sweep over two rates of a small `mixed` dataset.
  const std::string sweep = dir_ + "/sweep.json";
  ASSERT_EQ(
      RunBench(dir_, "sweep",
               {absl::StrCat("--target=", cluster.target()), "--sweep",
                "--request_rates=20,inf", "--dataset=mixed", "--num_prompts=6",
                "--input_len=8", "--long_input_len=64", "--long_fraction=0.5",
                "--output_len=4", absl::StrCat("--json_out=", sweep),
                absl::StrCat("--plot=", dir_, "/sweep.svg")},
               &out),
      0)
      << out;
  EXPECT_NE(out.find("Peak goodput"), std::string::npos) << out;
  auto sweep_result = loadgen::SweepFromJson(ReadFile(sweep));
  ASSERT_TRUE(sweep_result.ok()) << sweep_result.status();
  ASSERT_EQ(sweep_result->points.size(), 2u);
  for (const loadgen::SweepPoint& p : sweep_result->points) {
    EXPECT_EQ(p.metrics.completed, 6);
    EXPECT_EQ(p.metrics.failed, 0);
    EXPECT_EQ(p.metrics.total_output_tokens, 6 * 4);
  }

  // 4. --compare reads the JSON back without a cluster.
  ASSERT_EQ(RunBench(dir_, "compare",
                     {absl::StrCat("--compare=", json, ",", json2),
                      absl::StrCat("--plot=", dir_, "/compare.svg")},
                     &out),
            0)
      << out;
  EXPECT_NE(out.find("TPOT p99 (ms)"), std::string::npos) << out;
  EXPECT_NE(out.find(mode), std::string::npos) << out;
}

// A run in which every request fails measured nothing: bench prints its
// report (the errors counted) and exits 1 naming the first error.
TEST_F(BenchE2eTest, ARunInWhichEveryRequestFailsExitsNonZero) {
  Cluster cluster;
  // The router refuses every prompt above 8 tokens; bench sends 16.
  ASSERT_NO_FATAL_FAILURE(
      cluster.Start(dir_, {"--threads=1", "--decode=1", "--prefill=1",
                           "--router_args=--max_prompt_tokens=8"}));
  std::string out;
  const int status =
      RunBench(dir_, "all_failed",
               {absl::StrCat("--target=", cluster.target()), "--num_prompts=4",
                "--input_len=16", "--output_len=4"},
               &out);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;
  EXPECT_NE(out.find("Requests (ok/failed/total):        0/4/4"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("all 4 requests failed, nothing was measured; the "
                     "first: INVALID_ARGUMENT"),
            std::string::npos)
      << out;
}

INSTANTIATE_TEST_SUITE_P(Modes, BenchE2eTest,
                         ::testing::Values("disaggregated", "colocated"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pdserve
