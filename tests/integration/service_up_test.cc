// `pdserve up`: the README's main command streams a story and stops; a
// cluster started with up serves requests; no child outlives up, whether it
// is stopped with SIGTERM or killed with SIGKILL; a child killed with
// SIGKILL is restarted on its port and serves again (--restart=on-failure),
// requests sent meanwhile waiting for it, or stays down (--restart=never);
// so is a router whose gRPC listener ran out of descriptors.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/util/scoped_env.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

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
    for (int pid : pids) any |= ProcessAlive(pid);
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
  // up's children log into a folder under TMPDIR: the test's, removed
  // with it.
  ScopedEnv tmpdir("TMPDIR", up->dir.path());
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
  // No --threads: cores / 2 workers each, or 2 threads each sharing the
  // cores where that would be one (docs/performance.md, served layout).
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const std::string err = ReadFile(up->dir.path() + "/err");
  EXPECT_EQ(absl::StrContains(err, "each worker gets 2 threads, sharing"),
            cores / 2 == 1)
      << cores << " cores: " << err;
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
  // 4 workers: 2 threads each only where cores / 4 == 1 (never with more
  // workers than cores).
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(absl::StrContains(ReadFile(up->dir.path() + "/err"),
                              "each worker gets 2 threads, sharing"),
            cores / 4 == 1)
      << cores << " cores";
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
  // Nothing failed: the children's logs are removed.
  const std::string err = ReadFile(up->dir.path() + "/err");
  EXPECT_FALSE(absl::StrContains(err, "logs kept")) << err;
  int log_dirs = 0;
  for (const auto& e : std::filesystem::directory_iterator(up->dir.path())) {
    log_dirs += absl::StartsWith(e.path().filename().string(), "pdserve-up-");
  }
  EXPECT_EQ(log_dirs, 0);
}

// "NAME   127.0.0.1:PORT (pid PID)" lines of up's start-up report.
struct ChildLine {
  int port = 0;
  int pid = 0;
};
std::map<std::string, ChildLine> ChildLines(const std::string& out) {
  std::map<std::string, ChildLine> lines;
  std::regex re(
      "up: +(prefill[0-9]+|decode[0-9]+) +127\\.0\\.0\\.1:([0-9]+) \\(pid "
      "([0-9]+)\\)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end;
       ++it) {
    lines[(*it)[1]] = {std::stoi((*it)[2]), std::stoi((*it)[3])};
  }
  std::smatch m;
  std::regex router(
      "router listening on 127\\.0\\.0\\.1:([0-9]+) \\(mode [a-z]+, pid "
      "([0-9]+)\\)");
  if (std::regex_search(out, m, router)) {
    lines["router"] = {std::stoi(m[1]), std::stoi(m[2])};
  }
  return lines;
}

// Waits until up's stderr says `name` serves again; returns its new pid and
// port.
ChildLine WaitForRestart(Up& up, const std::string& name, int old_pid) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::regex re(
      name + " \\(pid ([0-9]+)\\) serving again on 127\\.0\\.0\\.1:([0-9]+)");
  while (absl::Now() < deadline) {
    const std::string err = ReadFile(up.dir.path() + "/err");
    for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end;
         ++it) {
      const int pid = std::stoi((*it)[1]);
      if (pid != old_pid) return {std::stoi((*it)[2]), pid};
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return {};
}

// Sends `ref`'s request until it succeeds (a restarted child may take a
// moment to be routed to again), for up to 30 s; the last outcome.
absl::StatusOr<GenerateResult> GenerateOnceServing(v1::Generation::Stub& stub,
                                                   const ReferenceCase& ref) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::StatusOr<GenerateResult> r = absl::UnavailableError("not tried");
  while (absl::Now() < deadline) {
    r = RunGenerate(stub, IdsRequest(ref.prompt_ids, ref.max_new_tokens),
                    absl::Seconds(10));
    if (r.ok()) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return r;
}

TEST(UpTest, KilledChildrenAreRestartedOnTheirPortsAndServeAgain) {
  auto up = StartUp({"--prefill=1", "--decode=1"});
  const std::string router = WaitReady(*up);
  ASSERT_FALSE(router.empty())
      << up->out() << ReadFile(up->dir.path() + "/err");
  auto children = ChildLines(up->out());
  ASSERT_EQ(children.size(), 3u) << up->out();
  const ReferenceCase ref = LoadReferenceCases()[0];
  auto stub = v1::Generation::NewStub(
      MakeChannel(router, grpc::InsecureChannelCredentials()));
  std::vector<int> all_pids;
  // Every kind of child, the router included, one after the other.
  for (const std::string name : {"decode0", "prefill0", "router"}) {
    SCOPED_TRACE(name);
    const ChildLine before = children[name];
    all_pids.push_back(before.pid);
    ASSERT_EQ(kill(before.pid, SIGKILL), 0);
    const ChildLine after = WaitForRestart(*up, name, before.pid);
    ASSERT_GT(after.pid, 0) << ReadFile(up->dir.path() + "/err");
    all_pids.push_back(after.pid);
    EXPECT_FALSE(ProcessAlive(before.pid));
    EXPECT_EQ(after.port, before.port);
    // Same port, and the cluster answers exactly again once the router has
    // seen the restarted worker healthy.
    absl::StatusOr<GenerateResult> r = GenerateOnceServing(*stub, ref);
    ASSERT_TRUE(r.ok()) << r.status() << ReadFile(up->dir.path() + "/err");
    EXPECT_EQ(r->output_ids, ref.output_ids);
  }
  const std::string err = ReadFile(up->dir.path() + "/err");
  EXPECT_TRUE(absl::StrContains(err, "restarting decode0 in 500ms")) << err;
  // The restarted children die with up too.
  up->proc.Signal(SIGKILL);
  (void)up->proc.Wait(absl::Seconds(10));
  EXPECT_TRUE(AllGone(all_pids, absl::Seconds(5)));
}

// Requests sent while the only decode worker is down (killed, restarting)
// wait for it (the router's --worker_wait) instead of failing, and complete
// exactly once it serves again.
TEST(UpTest, RequestsWaitForARestartingDecodeWorker) {
  auto up = StartUp({"--prefill=1", "--decode=1"});
  const std::string router = WaitReady(*up);
  ASSERT_FALSE(router.empty())
      << up->out() << ReadFile(up->dir.path() + "/err");
  const ChildLine decode = ChildLines(up->out())["decode0"];
  ASSERT_GT(decode.pid, 0) << up->out();
  auto stub = v1::Generation::NewStub(
      MakeChannel(router, grpc::InsecureChannelCredentials()));
  const ReferenceCase ref = LoadReferenceCases()[0];
  ASSERT_EQ(kill(decode.pid, SIGKILL), 0);
  while (ProcessAlive(decode.pid)) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_FALSE(
      absl::StrContains(ReadFile(up->dir.path() + "/err"), "serving again"))
      << "restarted before the requests were sent";
  std::vector<absl::StatusOr<GenerateResult>> results(3);
  std::vector<std::thread> clients;
  for (auto& r : results) {
    clients.emplace_back([&] {
      r = RunGenerate(*stub, IdsRequest(ref.prompt_ids, ref.max_new_tokens),
                      absl::Seconds(60));
    });
  }
  for (auto& t : clients) t.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status() << ReadFile(up->dir.path() + "/err");
    EXPECT_EQ(r->output_ids, ref.output_ids);
  }
  EXPECT_GT(WaitForRestart(*up, "decode0", decode.pid).pid, 0);
  up->proc.Signal(SIGTERM);
  (void)up->proc.Wait(absl::Seconds(30));
  // A child failed during the run: its log (both processes') is kept.
  const std::string err = ReadFile(up->dir.path() + "/err");
  std::smatch kept;
  ASSERT_TRUE(std::regex_search(
      err, kept, std::regex("logs kept in (\\S+)/ \\(failed: decode0\\)")))
      << err;
  const std::string log = ReadFile(std::string(kept[1]) + "/decode0.log");
  EXPECT_TRUE(absl::StrContains(log, "pdserve decode")) << log;
}

TEST(UpTest, RestartNeverLeavesAFailedWorkerDown) {
  auto up = StartUp({"--prefill=1", "--decode=1", "--restart=never"});
  ASSERT_FALSE(WaitReady(*up).empty()) << up->out();
  const ChildLine decode = ChildLines(up->out())["decode0"];
  ASSERT_EQ(kill(decode.pid, SIGKILL), 0);
  absl::SleepFor(absl::Seconds(2));
  const std::string err = ReadFile(up->dir.path() + "/err");
  EXPECT_TRUE(absl::StrContains(err, "decode0 (pid")) << err;
  EXPECT_FALSE(absl::StrContains(err, "restarting")) << err;
  EXPECT_TRUE(up->proc.running() && !up->proc.Poll().has_value());
  up->proc.Signal(SIGTERM);
  (void)up->proc.Wait(absl::Seconds(30));
}

// A worker that exits while the cluster starts: up fails, and says why
// with the end of that worker's log (here UCX refusing a UCX_TLS naming no
// transport, which --kv_transport=ucx makes fatal).
// up started with UCX_TLS naming no transport (its children inherit it).
std::unique_ptr<Up> StartUpWithoutUsableUcx(
    const std::vector<std::string>& args) {
  ScopedEnv env("UCX_TLS", "no-such-transport");
  return StartUp(args);
}

TEST(UpTest, AWorkerThatCannotStartIsReportedWithItsLog) {
  auto up = StartUpWithoutUsableUcx({"--kv_transport=ucx", "--restart=never"});
  auto st = up->proc.Wait(absl::Seconds(60));
  ASSERT_TRUE(st.ok()) << "up did not give up";
  EXPECT_FALSE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0);
  const std::string err = ReadFile(up->dir.path() + "/err");
  EXPECT_TRUE(absl::StrContains(err, "while starting; the end of")) << err;
  EXPECT_TRUE(absl::StrContains(err, "UCX_TLS=no-such-transport")) << err;
  EXPECT_TRUE(AllGone(ChildPids(up->out()), absl::Seconds(5)));
}

// The same UCX_TLS with --kv_transport=auto (the default): the workers
// start without UCX (they once aborted: a UcxWorker whose initialisation
// failed joined its thread twice) and KV moves over gRPC.
TEST(UpTest, UnusableUcxFallsBackToGrpcUnderAuto) {
  auto up = StartUpWithoutUsableUcx(
      {"--demo_prompt=Once upon a time", "--max_tokens=20"});
  auto st = up->proc.Wait(absl::Seconds(90));
  ASSERT_TRUE(st.ok()) << "up did not finish";
  const std::string out = up->out();
  const std::string err = ReadFile(up->dir.path() + "/err");
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
      << DescribeWaitStatus(*st) << out << err;
  EXPECT_TRUE(absl::StrContains(out, "Once upon a time")) << out;
  EXPECT_TRUE(absl::StrContains(err, "cluster stopped")) << err;
}

// Open descriptors of process `pid` (-1 when /proc cannot be read).
int OpenDescriptors(int pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

// gRPC 1.51 stops accepting on a listener whose accept failed with EMFILE.
// A router that ran out of descriptors (its limit lowered under it, then
// flooded with connections) says so, exits, and up restarts it on its
// port, where it serves again.
TEST(UpTest, ARouterOutOfDescriptorsIsRestartedAndServesAgain) {
  auto up = StartUp({"--prefill=1", "--decode=1"});
  const std::string router = WaitReady(*up);
  ASSERT_FALSE(router.empty())
      << up->out() << ReadFile(up->dir.path() + "/err");
  const ChildLine before = ChildLines(up->out())["router"];
  ASSERT_GT(before.pid, 0) << up->out();
  const int open_now = OpenDescriptors(before.pid);
  ASSERT_GT(open_now, 0);
  const rlim_t low = static_cast<rlim_t>(open_now + 16);
  const rlimit limit{low, low};
  ASSERT_EQ(prlimit(before.pid, RLIMIT_NOFILE, &limit, nullptr), 0)
      << std::strerror(errno);
  std::vector<int> flood;
  for (int i = 0; i < 64; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(before.port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      break;
    }
    flood.push_back(fd);
  }
  const ChildLine after = WaitForRestart(*up, "router", before.pid);
  for (int fd : flood) close(fd);
  const std::string err = ReadFile(up->dir.path() + "/err");
  ASSERT_GT(after.pid, 0) << err;
  EXPECT_EQ(after.port, before.port);
  // The router's own log says why (up names that log).
  EXPECT_TRUE(absl::StrContains(
      err, absl::StrCat("router (pid ", before.pid, ") exited with code 3")))
      << err;
  const ReferenceCase ref = LoadReferenceCases()[0];
  auto stub = v1::Generation::NewStub(
      MakeChannel(router, grpc::InsecureChannelCredentials()));
  absl::StatusOr<GenerateResult> r = GenerateOnceServing(*stub, ref);
  ASSERT_TRUE(r.ok()) << r.status() << ReadFile(up->dir.path() + "/err");
  EXPECT_EQ(r->output_ids, ref.output_ids);
  up->proc.Signal(SIGTERM);
  (void)up->proc.Wait(absl::Seconds(30));
}

TEST(UpTest, BadRestartPolicyIsRefused) {
  auto up = StartUp({"--restart=sometimes"});
  auto st = up->proc.Wait(absl::Seconds(30));
  ASSERT_TRUE(st.ok());
  EXPECT_FALSE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0);
  EXPECT_TRUE(absl::StrContains(ReadFile(up->dir.path() + "/err"),
                                "--restart must be on-failure or never"));
}

}  // namespace
}  // namespace pdserve::testing
