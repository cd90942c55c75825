// Chaos soak: `pdserve up` with 1 prefill and 2 decode workers on
// synthetic:llama-110m (bf16) serves a closed loop of mixed greedy and seeded
// requests while, every few seconds, a random worker is killed with SIGKILL
// (up's supervision restarts it on its port). Afterwards:
//  - every completed request equals `pdserve complete` on the same request,
//    token for token (migrated streams included);
//  - every failure is UNAVAILABLE, RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED
//    with a message;
//  - every worker has 0 KV blocks in use and 0 pending leases;
//  - every process's RSS stays under a stated bound;
//  - after up stops: no process it started (restarts included) is left, and
//    no /dev/shm entry appeared.
// The figures are printed. The suite runs the short form; the long form is
// build/tests/soak_test with PDSERVE_SOAK_REQUESTS=2000 and
// PDSERVE_SOAK_CONCURRENCY=12 in its environment (docs/service.md "Chaos
// soak").
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/util/scoped_env.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pdserve/v1/worker.grpc.pb.h"
#include "tests/integration/cluster_harness.h"
#include "tools/client/generate_client.h"

namespace pdserve::testing {
namespace {

namespace pb = ::pdserve::v1;
namespace pbi = ::pdserve::v1::internal;

constexpr char kModel[] = "synthetic:llama-110m";
constexpr char kDtype[] = "bf16";
constexpr char kKvCacheMemory[] = "256MiB";
// RSS bound of one worker: bf16 weights of the 134M-parameter model
// (268 MB), its KV pool, and this margin for runtime, gRPC and UCX.
constexpr int64_t kWorkerRssMargin = 384ll << 20;
constexpr int64_t kWorkerWeights = 268ll << 20;
constexpr int64_t kKvPool = 256ll << 20;
constexpr int64_t kRouterRssBound = 256ll << 20;

int EnvInt(const char* name, int fallback) {
  const char* v = getenv(name);
  int out;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : fallback;
}

int64_t RssBytes(int pid) {
  std::istringstream in(ReadFile(absl::StrCat("/proc/", pid, "/status")));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      int64_t kb = 0;
      std::istringstream(line.substr(6)) >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

std::set<std::string> ShmEntries() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.insert(n);
    }
    closedir(d);
  }
  return out;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * v.size()));
  return v[i];
}

// A worker of the cluster as up reports it: name, address, current pid.
struct Worker {
  std::string name;
  std::string address;
  int pid = 0;
};

// Reads up's output: the workers (name, address, pid) from the ready lines,
// and the pid of every (re)started child.
std::map<std::string, Worker> ParseWorkers(const std::string& out) {
  std::map<std::string, Worker> workers;
  std::regex re(
      "up:   ((prefill|decode)[0-9]+) +([0-9.]+:[0-9]+) \\(pid ([0-9]+)\\)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end;
       ++it) {
    Worker w;
    w.name = (*it)[1];
    w.address = (*it)[3];
    w.pid = std::stoi((*it)[4]);
    workers[w.name] = w;
  }
  return workers;
}

// "X (pid N) serving again on ..." lines: X's current pid, and how many.
int ServingAgain(const std::string& err, std::map<std::string, Worker>* w) {
  std::regex re(
      "up: ((prefill|decode)[0-9]+) \\(pid ([0-9]+)\\) serving again");
  int n = 0;
  for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end;
       ++it) {
    ++n;
    (*w)[(*it)[1]].pid = std::stoi((*it)[3]);
  }
  return n;
}

std::vector<int> AllPids(const std::string& text) {
  std::vector<int> pids;
  std::regex re("pid ([0-9]+)");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end;
       ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  return pids;
}

struct SoakRequest {
  pb::GenerateRequest request;
  std::vector<int32_t> expected;
};

// One request's outcome.
struct Outcome {
  absl::Status status;
  std::vector<int32_t> output_ids;
  int migrations = 0;
  double ttft_ms = 0;
  absl::Time start;
};

TEST(ChaosSoak, RandomWorkerKillsLoseNothingAndLeakNothing) {
  const int num_requests = EnvInt("PDSERVE_SOAK_REQUESTS", 64);
  const int concurrency = EnvInt("PDSERVE_SOAK_CONCURRENCY", 8);
  const int kill_every_ms = EnvInt("PDSERVE_SOAK_KILL_EVERY_MS", 2500);
  const int first_kill_ms = std::min(kill_every_ms, 1500);
  const int max_tokens = EnvInt("PDSERVE_SOAK_MAX_TOKENS", 24);
  std::mt19937 rng(EnvInt("PDSERVE_SOAK_SEED", 1));
  // The KV transport of the workers: `auto` (UCX, the default data plane)
  // unless PDSERVE_SOAK_KV_TRANSPORT says otherwise (grpc). Killing P in the
  // middle of a UCX push used to abort D inside UCX 1.13 (see
  // UcxPeerDeathTest in ucx_transport_test.cc).
  const char* transport_env = getenv("PDSERVE_SOAK_KV_TRANSPORT");
  const std::string kv_transport =
      transport_env != nullptr && *transport_env != '\0' ? transport_env
                                                         : "auto";

  // The requests: random prompts of 8-96 tokens; every third one seeded
  // sampling, the rest greedy.
  TempDir dir;
  std::vector<SoakRequest> requests(num_requests);
  {
    std::ofstream jsonl(dir.path() + "/requests.jsonl");
    for (int i = 0; i < num_requests; ++i) {
      std::vector<int32_t> ids = {1};
      const int len = std::uniform_int_distribution<int>(8, 96)(rng);
      for (int k = 0; k < len; ++k)
        ids.push_back(std::uniform_int_distribution<int>(3, 31999)(rng));
      pb::GenerateRequest req = IdsRequest(ids, max_tokens);
      req.set_ignore_eos(true);
      nlohmann::json j = {{"prompt_ids", ids},
                          {"max_tokens", max_tokens},
                          {"ignore_eos", true}};
      if (i % 3 == 2) {
        req.mutable_sampling()->set_temperature(0.8f);
        req.mutable_sampling()->set_top_p(0.95f);
        req.mutable_sampling()->set_seed(1000 + i);
        j["temperature"] = 0.8;
        j["top_p"] = 0.95;
        j["seed"] = 1000 + i;
      }
      requests[i].request = req;
      jsonl << j.dump() << "\n";
    }
  }
  // The in-process engine's answers.
  auto ref = RunPdserveCapture(
      {"complete", absl::StrCat("--model=", kModel),
       absl::StrCat("--dtype=", kDtype), "--threads=1", "--json",
       absl::StrCat("--input_jsonl=", dir.path(), "/requests.jsonl")},
      absl::Minutes(10));
  ASSERT_TRUE(ref.ok()) << ref.status();
  {
    std::istringstream lines(*ref);
    std::string line;
    int i = 0;
    while (std::getline(lines, line) && i < num_requests) {
      requests[i++].expected =
          nlohmann::json::parse(line)["output_ids"].get<std::vector<int32_t>>();
    }
    ASSERT_EQ(i, num_requests) << *ref;
  }

  const std::set<std::string> shm_before = ShmEntries();
  SubprocessOptions so;
  so.stdout_path = dir.path() + "/up.out";
  so.stderr_path = dir.path() + "/up.err";
  ScopedEnv tmpdir("TMPDIR", dir.path());  // up's log folder goes there
  auto up = Subprocess::Start(
      {PdserveBinary(), "up", "--port=0", "--http_port=0", "--prefill=1",
       "--decode=2", absl::StrCat("--model=", kModel),
       absl::StrCat("--dtype=", kDtype),
       absl::StrCat("--kv_cache_memory=", kKvCacheMemory),
       absl::StrCat("--kv_transport=", kv_transport)},
      so);
  ASSERT_TRUE(up.ok()) << up.status();
  std::string router;
  const absl::Time ready_by = absl::Now() + absl::Minutes(3);
  while (router.empty() && absl::Now() < ready_by && !up->Poll()) {
    const std::string out = ReadFile(so.stdout_path);
    std::smatch m;
    if (absl::StrContains(out, "ready") &&
        std::regex_search(out, m,
                          std::regex("router listening on ([0-9.]+:[0-9]+)")))
      router = m[1];
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_FALSE(router.empty())
      << ReadFile(so.stdout_path) << ReadFile(so.stderr_path);
  std::map<std::string, Worker> workers =
      ParseWorkers(ReadFile(so.stdout_path));
  ASSERT_EQ(workers.size(), 3u) << ReadFile(so.stdout_path);
  const int router_pid = AllPids(ReadFile(so.stdout_path)).front();

  // The load: `concurrency` client threads over the request list.
  auto stub = pb::Generation::NewStub(
      MakeChannel(router, grpc::InsecureChannelCredentials()));
  std::vector<Outcome> outcomes(num_requests);
  std::atomic<int> next{0};
  std::atomic<bool> load_done{false};
  std::vector<std::thread> clients;
  const absl::Time load_start = absl::Now();
  for (int t = 0; t < concurrency; ++t) {
    clients.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < num_requests;) {
        Outcome& o = outcomes[i];
        o.start = absl::Now();
        auto r = RunGenerate(*stub, requests[i].request, absl::Minutes(2));
        o.status = r.status();
        if (r.ok()) {
          o.output_ids = r->output_ids;
          o.migrations = r->migrations;
          o.ttft_ms = r->ttft_ms;
        }
      }
    });
  }
  // The chaos: every kill_every_ms, SIGKILL a random worker, once every
  // worker killed before serves again (so that kills test recovery, not a
  // cluster with no decode worker at all).
  std::vector<absl::Time> kill_times;
  std::map<std::string, int> kills_by_worker;
  std::thread chaos([&] {
    int restarts_seen = 0;
    while (!load_done) {
      absl::SleepFor(absl::Milliseconds(kill_times.empty() ? first_kill_ms
                                                           : kill_every_ms));
      if (load_done) break;
      const absl::Time wait_until = absl::Now() + absl::Seconds(60);
      while (!load_done && absl::Now() < wait_until) {
        restarts_seen = ServingAgain(ReadFile(so.stderr_path), &workers);
        if (restarts_seen == static_cast<int>(kill_times.size())) break;
        absl::SleepFor(absl::Milliseconds(100));
      }
      if (load_done || restarts_seen != static_cast<int>(kill_times.size())) {
        break;
      }
      auto it = workers.begin();
      std::advance(it, std::uniform_int_distribution<int>(
                           0, static_cast<int>(workers.size()) - 1)(rng));
      kill(it->second.pid, SIGKILL);
      kill_times.push_back(absl::Now());
      ++kills_by_worker[it->first];
    }
  });
  for (auto& c : clients) c.join();
  const double load_seconds = absl::ToDoubleSeconds(absl::Now() - load_start);
  load_done = true;
  chaos.join();

  // Every worker serves again (the last kill's restart included).
  const absl::Time settle_by = absl::Now() + absl::Seconds(90);
  while (ServingAgain(ReadFile(so.stderr_path), &workers) <
             static_cast<int>(kill_times.size()) &&
         absl::Now() < settle_by) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(ServingAgain(ReadFile(so.stderr_path), &workers),
            static_cast<int>(kill_times.size()))
      << ReadFile(so.stderr_path);

  // Outcomes.
  int completed = 0, migrated = 0, mismatched = 0;
  std::map<std::string, int> failed_by_code;
  std::set<std::string> failure_examples;
  std::vector<double> ttft_steady, ttft_after_kill;
  for (int i = 0; i < num_requests; ++i) {
    const Outcome& o = outcomes[i];
    if (o.status.ok()) {
      ++completed;
      if (o.migrations > 0) ++migrated;
      if (o.output_ids != requests[i].expected) {
        ++mismatched;
        ADD_FAILURE() << "request " << i << " (migrations " << o.migrations
                      << ") differs from pdserve complete:\n  got "
                      << absl::StrJoin(o.output_ids, ",") << "\n want "
                      << absl::StrJoin(requests[i].expected, ",");
      }
      bool near_kill = false;
      for (absl::Time k : kill_times) {
        near_kill |=
            o.start >= k - absl::Seconds(1) && o.start < k + absl::Seconds(5);
      }
      (near_kill ? ttft_after_kill : ttft_steady).push_back(o.ttft_ms);
      continue;
    }
    const absl::StatusCode code = o.status.code();
    ++failed_by_code[absl::StatusCodeToString(code)];
    if (failure_examples.size() < 3) {
      failure_examples.insert(std::string(o.status.message()).substr(0, 200));
    }
    EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
                code == absl::StatusCode::kResourceExhausted ||
                code == absl::StatusCode::kDeadlineExceeded)
        << "request " << i << ": " << o.status;
    EXPECT_FALSE(o.status.message().empty()) << "request " << i;
  }

  // Leaks: KV blocks and leases on every worker (leases expire in 5 s).
  absl::SleepFor(absl::Seconds(6));
  std::string worker_state;
  for (const auto& [name, w] : workers) {
    auto channel = MakeChannel(w.address, grpc::InsecureChannelCredentials());
    auto worker_stub = pbi::Worker::NewStub(channel);
    pbi::WorkerStatusResponse st;
    grpc::Status s;
    for (int attempt = 0; attempt < 20; ++attempt) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      s = worker_stub->Status(&ctx, pbi::WorkerStatusRequest(), &st);
      if (s.ok() && st.free_kv_blocks() == st.total_kv_blocks() &&
          st.pending_leases() == 0) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(500));
    }
    ASSERT_TRUE(s.ok()) << name << ": " << s.error_message();
    EXPECT_EQ(st.total_kv_blocks() - st.free_kv_blocks(), 0)
        << name << " holds KV blocks";
    EXPECT_EQ(st.pending_leases(), 0) << name << " holds leases";
    const int64_t rss = RssBytes(w.pid);
    const int64_t bound = kWorkerWeights + kKvPool + kWorkerRssMargin;
    EXPECT_GT(rss, 0);
    EXPECT_LE(rss, bound) << name << " RSS";
    absl::StrAppend(&worker_state, "  ", name, ": ",
                    st.total_kv_blocks() - st.free_kv_blocks(),
                    " KV blocks in use, ", st.pending_leases(), " leases, RSS ",
                    rss >> 20, " MiB (bound ", bound >> 20, " MiB)\n");
  }
  const int64_t router_rss = RssBytes(router_pid);
  EXPECT_LE(router_rss, kRouterRssBound);

  // Children that failed by themselves (not killed by this test) are bugs.
  {
    std::istringstream err(ReadFile(so.stderr_path));
    std::string line;
    while (std::getline(err, line)) {
      if (absl::StrContains(line, " exited with ") ||
          (absl::StrContains(line, "killed by signal") &&
           !absl::StrContains(line, "signal 9 "))) {
        std::string log_tail;
        const size_t see = line.find("; see ");
        if (see != std::string::npos) {
          const std::string log = ReadFile(line.substr(see + 6));
          log_tail = log.substr(log.size() > 3000 ? log.size() - 3000 : 0);
        }
        ADD_FAILURE() << "a child failed on its own: " << line
                      << "\n--- the end of its log:\n"
                      << log_tail;
      }
    }
  }

  // Stop up; nothing it started (restarts included) may outlive it.
  up->Signal(SIGTERM);
  auto st = up->Wait(absl::Seconds(60));
  ASSERT_TRUE(st.ok()) << "up did not stop on SIGTERM";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
      << DescribeWaitStatus(*st);
  const std::vector<int> all_pids =
      AllPids(ReadFile(so.stdout_path) + ReadFile(so.stderr_path));
  int orphans = 0;
  absl::SleepFor(absl::Milliseconds(500));
  for (int pid : all_pids) orphans += ProcessAlive(pid) ? 1 : 0;
  EXPECT_EQ(orphans, 0) << "processes started by up are still running";
  std::vector<std::string> new_shm;
  for (const std::string& e : ShmEntries())
    if (!shm_before.count(e)) new_shm.push_back(e);
  EXPECT_TRUE(new_shm.empty()) << absl::StrJoin(new_shm, " ");

  std::string kills;
  for (const auto& [name, n] : kills_by_worker)
    absl::StrAppend(&kills, " ", name, "=", n);
  std::string failures;
  for (const auto& [code, n] : failed_by_code)
    absl::StrAppend(&failures, " ", code, "=", n);
  for (const std::string& m : failure_examples)
    absl::StrAppend(&failures, "\n    e.g. ", m);
  std::printf(
      "chaos soak: %s %s, up --prefill=1 --decode=2 --kv_transport=%s, %d "
      "requests (%d seeded) "
      "of %d tokens, %d concurrent, %.1f s\n"
      "  completed %d (%d migrated, %d different from complete), failed %d:%s\n"
      "  kills %zu:%s (one every %.1f s)\n"
      "  TTFT p50/p99: %.0f/%.0f ms steady (%zu), %.0f/%.0f ms within 5 s "
      "after a kill (%zu)\n%s"
      "  router RSS %lld MiB; after stop: %d of %zu processes left, %zu new "
      "/dev/shm entries\n",
      kModel, kDtype, kv_transport.c_str(), num_requests, num_requests / 3,
      max_tokens, concurrency, load_seconds, completed, migrated, mismatched,
      num_requests - completed, failures.empty() ? " none" : failures.c_str(),
      kill_times.size(), kills.c_str(), kill_every_ms / 1000.0,
      Percentile(ttft_steady, 0.5), Percentile(ttft_steady, 0.99),
      ttft_steady.size(), Percentile(ttft_after_kill, 0.5),
      Percentile(ttft_after_kill, 0.99), ttft_after_kill.size(),
      worker_state.c_str(), static_cast<long long>(router_rss >> 20), orphans,
      all_pids.size(), new_shm.size());
  // The soak must have exercised something.
  EXPECT_GE(kill_times.size(), 2u) << "too few kills: the load ended first";
  EXPECT_GE(completed, num_requests / 2);
}

}  // namespace
}  // namespace pdserve::testing
