// `pdserve up`: the README's main command streams a story and stops; a
// cluster started with up serves requests; no child outlives up, whether it
// is stopped with SIGTERM or killed with SIGKILL.
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Alive = exists and is not a zombie.
bool Alive(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() &&
         stat[close + 2] != 'Z';
}

std::vector<int> ChildPids(const std::string& out) {
  std::vector<int> pids;
  std::regex re("pid ([0-9]+)\\)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end;
       ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  return pids;
}

bool AllGone(const std::vector<int>& pids, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    bool any = false;
    for (int pid : pids) any |= Alive(pid);
    if (!any) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// Starts `pdserve up` with `args`; waits for "ready" or exit.
struct Up {
  TempDir dir;
  Subprocess proc;
  std::string out_path() const { return dir.path() + "/out"; }
  std::string out() const { return ReadFile(out_path()); }
};

std::unique_ptr<Up> StartUp(const std::vector<std::string>& args) {
  auto up = std::make_unique<Up>();
  std::vector<std::string> argv = {PdserveBinary(), "up", "--port=0",
                                   "--http_port=-1"};
  argv.insert(argv.end(), args.begin(), args.end());
  SubprocessOptions so;
  so.stdout_path = up->out_path();
  so.stderr_path = up->dir.path() + "/err";
  auto proc = Subprocess::Start(argv, so);
  EXPECT_TRUE(proc.ok());
  up->proc = *std::move(proc);
  return up;
}

TEST(UpTest, DemoPromptStreamsAStoryAndStops) {
  auto up = StartUp({"--demo_prompt=Once upon a time", "--max_tokens=40"});
  auto st = up->proc.Wait(absl::Seconds(90));
  ASSERT_TRUE(st.ok()) << "up did not finish";
  const std::string out = up->out();
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
      << DescribeWaitStatus(*st) << out << ReadFile(up->dir.path() + "/err");
  EXPECT_TRUE(absl::StrContains(out, "router listening on")) << out;
  const size_t story = out.find("Once upon a time");
  ASSERT_NE(story, std::string::npos) << out;
  EXPECT_GT(out.size() - story, std::string("Once upon a time").size() + 20)
      << "no story streamed: " << out;
  const auto pids = ChildPids(out);
  EXPECT_EQ(pids.size(), 3u);  // router, prefill, decode
  EXPECT_TRUE(AllGone(pids, absl::Seconds(5)));
}

// Waits for the ready line; returns the router address.
std::string WaitReady(Up& up) {
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  std::regex re("router listening on ([0-9.]+:[0-9]+)");  // then " (mode"
  while (absl::Now() < deadline) {
    const std::string out = up.out();
    std::smatch m;
    if (absl::StrContains(out, "ready") && std::regex_search(out, m, re))
      return m[1];
    if (up.proc.Poll().has_value()) return "";
    absl::SleepFor(absl::Milliseconds(50));
  }
  return "";
}

TEST(UpTest, ClusterServesAndSigkillOfUpLeavesNoOrphans) {
  auto up = StartUp({"--prefill=2", "--decode=2"});
  const std::string router = WaitReady(*up);
  ASSERT_FALSE(router.empty())
      << up->out() << ReadFile(up->dir.path() + "/err");
  const auto pids = ChildPids(up->out());
  ASSERT_EQ(pids.size(), 5u);  // router + 2 prefill + 2 decode
  auto stub = v1::Generation::NewStub(
      MakeChannel(router, grpc::InsecureChannelCredentials()));
  const ReferenceCase ref = LoadReferenceCases()[0];
  auto r = RunGenerate(*stub, IdsRequest(ref.prompt_ids, ref.max_new_tokens),
                       absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output_ids, ref.output_ids);
  up->proc.Signal(SIGKILL);
  (void)up->proc.Wait(absl::Seconds(10));
  EXPECT_TRUE(AllGone(pids, absl::Seconds(5)))
      << "orphan workers after SIGKILL of up";
  // The router too: its port stops answering.
  EXPECT_FALSE(
      CheckHealth(*MakeChannel(router, grpc::InsecureChannelCredentials()),
                  absl::Milliseconds(500))
          .ok());
}

TEST(UpTest, SigtermStopsEverythingCleanly) {
  auto up = StartUp({"--prefill=1", "--decode=1", "--drain_timeout_seconds=5"});
  const std::string router = WaitReady(*up);
  ASSERT_FALSE(router.empty()) << up->out();
  const auto pids = ChildPids(up->out());
  up->proc.Signal(SIGTERM);
  auto st = up->proc.Wait(absl::Seconds(30));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
      << DescribeWaitStatus(*st);
  EXPECT_TRUE(AllGone(pids, absl::Seconds(5)));
}

}  // namespace
}  // namespace pdserve::testing
