// `pdserve up`: a whole local cluster (router + N prefill + M decode workers)
// as real child processes on loopback, supervised: a child that fails is
// restarted on its ports with exponential backoff (--restart). Children die
// with `up` (even on SIGKILL: PR_SET_PDEATHSIG); SIGINT/SIGTERM drains and
// stops them all.
// Every child serves Prometheus /metrics on a free loopback port, printed
// next to its gRPC address.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "common/grpc_util/grpc_util.h"
#include "common/util/logging.h"
#include "common/util/signals.h"
#include "common/util/status_macros.h"
#include "common/util/subprocess.h"
#include "common/util/system_memory.h"
#include "router/router_options.h"
#include "tools/client/generate_client.h"
#include "tools/common_flags.h"
#include "tools/engine_flags.h"
#include "tools/service_cmds/kv_transport_flags.h"
#include "tools/service_cmds/service_common.h"
#include "tools/subcommand.h"

ABSL_DECLARE_FLAG(int32_t, http_port);

ABSL_FLAG(int32_t, prefill, 1, "number of prefill workers");
ABSL_FLAG(int32_t, decode, 1, "number of decode workers");
ABSL_FLAG(std::string, demo_prompt, "",
          "start the cluster, stream one answer to this prompt, stop");
ABSL_FLAG(int32_t, startup_timeout_seconds, 120,
          "how long the cluster may take to become healthy");
ABSL_FLAG(std::string, prefill_args, "",
          "extra flags for every prefill worker (space-separated)");
ABSL_FLAG(std::string, decode_args, "",
          "extra flags for every decode worker (space-separated)");
ABSL_FLAG(std::string, router_args, "",
          "extra flags for the router (space-separated)");
ABSL_FLAG(std::string, restart, "on-failure",
          "restart a child that fails (exits non-zero or is killed), on "
          "its ports, with exponential backoff (on-failure), or leave it "
          "down (never)");

namespace pdserve {
namespace {

namespace v1 = ::pdserve::v1;

// One child role process and what restarting it needs.
struct Child {
  std::string name;                // "prefill0"
  std::string role;                // prefill | decode | router
  std::vector<std::string> flags;  // as first started (without --port_file)
  std::string port_file;
  std::string log_file;  // its stdout and stderr
  int port = 0;
  int metrics_port = 0;  // from the port file's "metrics=PORT" line
  int http_port = 0;     // the router's "http=PORT" line
  Subprocess proc;
  // Supervision (--restart=on-failure).
  int restarts = 0;                      // in a row (reset after a stable run)
  absl::Time started;                    // when the current process started
  std::optional<absl::Time> restart_at;  // scheduled restart
  bool starting = false;                 // restarted, port file not written yet
  bool ever_failed = false;  // its log holds a failure: keep the logs
};

// The delay before restart number `n` (0-based): 0.5 s doubling to 30 s.
absl::Duration RestartBackoff(int n) {
  return std::min(absl::Seconds(30),
                  absl::Milliseconds(500) * (1 << std::min(n, 6)));
}
// A child that ran this long before failing starts its backoff over.
constexpr absl::Duration kStableRun = absl::Seconds(30);

std::vector<std::string> SplitArgs(const std::string& s) {
  return absl::StrSplit(s, ' ', absl::SkipEmpty());
}

// Flags every child shares with `up`.
// The flags of `up` that `role` takes, as its command line (each child gets
// only the flags its subcommand takes: the router has no --dtype).
std::vector<std::string> CommonChildFlags(const std::string& role,
                                          int threads) {
  std::vector<std::string> f = {
      absl::StrCat("--model=", absl::GetFlag(FLAGS_model)),
      absl::StrCat("--tokenizer=", absl::GetFlag(FLAGS_tokenizer)),
      absl::StrCat("--dtype=", absl::GetFlag(FLAGS_dtype)),
      absl::StrCat("--quantization=", absl::GetFlag(FLAGS_quantization)),
      absl::StrCat("--kv_dtype=", absl::GetFlag(FLAGS_kv_dtype)),
      absl::StrCat("--kv_cache_memory=", absl::GetFlag(FLAGS_kv_cache_memory)),
      absl::StrCat("--block_size=", absl::GetFlag(FLAGS_block_size)),
      absl::StrCat("--threads=", threads),
      absl::StrCat("--max_num_seqs=", absl::GetFlag(FLAGS_max_num_seqs)),
      absl::StrCat("--prefill_chunk_tokens=",
                   absl::GetFlag(FLAGS_prefill_chunk_tokens)),
      absl::StrCat("--drain_timeout_seconds=",
                   absl::GetFlag(FLAGS_drain_timeout_seconds)),
      absl::StrCat("--kv_transport=", absl::GetFlag(FLAGS_kv_transport)),
      absl::StrCat("--prefix_caching=",
                   absl::GetFlag(FLAGS_prefix_caching) ? "true" : "false"),
      "--host=127.0.0.1",
      "--metrics_port=-1",  // any free port, reported in the port file
  };
  for (const auto& [flag, value] :
       {std::pair{"internal_ca", absl::GetFlag(FLAGS_internal_ca)},
        std::pair{"internal_cert", absl::GetFlag(FLAGS_internal_cert)},
        std::pair{"internal_key", absl::GetFlag(FLAGS_internal_key)}}) {
    if (!value.empty()) f.push_back(absl::StrCat("--", flag, "=", value));
  }
  const std::vector<std::string> takes = FlagsOfSubcommand(role);
  std::vector<std::string> out;
  for (std::string& flag : f) {
    const std::string name = flag.substr(2, flag.find('=') - 2);
    if (std::binary_search(takes.begin(), takes.end(), name)) {
      out.push_back(std::move(flag));
    }
  }
  return out;
}

absl::Status StartChild(const std::string& self, const std::string& role,
                        std::vector<std::string> flags, const std::string& dir,
                        Child* child) {
  child->role = role;
  child->flags = flags;
  child->port_file = absl::StrCat(dir, "/", child->name, ".port");
  std::remove(child->port_file.c_str());  // a restart waits for a new one
  std::vector<std::string> argv = {self, role};
  for (auto& f : flags) argv.push_back(std::move(f));
  argv.push_back(absl::StrCat("--port_file=", child->port_file));
  child->started = absl::Now();
  SubprocessOptions so;  // the child's output goes to its log file
  child->log_file = absl::StrCat(dir, "/", child->name, ".log");
  so.stdout_path = child->log_file;
  so.stderr_path = so.stdout_path;
  auto proc = Subprocess::Start(argv, so);
  if (!proc.ok()) return proc.status();
  child->proc = *std::move(proc);
  return absl::OkStatus();
}

// Reads the child's port file; false until it exists.
bool ReadPortFile(Child& child) {
  std::ifstream in(child.port_file);
  std::string text;
  if (!in || !std::getline(in, text) || !absl::SimpleAtoi(text, &child.port) ||
      child.port <= 0) {
    return false;
  }
  while (std::getline(in, text)) {
    absl::string_view rest = text;
    if (absl::ConsumePrefix(&rest, "metrics=")) {
      (void)absl::SimpleAtoi(rest, &child.metrics_port);
    } else if (absl::ConsumePrefix(&rest, "http=")) {
      (void)absl::SimpleAtoi(rest, &child.http_port);
    }
  }
  return true;
}

// A child that exited before it was ready, with the last lines of its log
// (what it said on the way out).
absl::Status ExitedWhileStarting(const Child& child, int wait_status) {
  std::ifstream in(child.log_file);
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    tail.push_back(std::move(line));
    if (tail.size() > 5) tail.pop_front();
  }
  std::string said;
  for (const std::string& line : tail) absl::StrAppend(&said, "\n  ", line);
  return absl::UnavailableError(
      absl::StrCat(child.name, " ", DescribeWaitStatus(wait_status),
                   " while starting; the end of ", child.log_file, ":", said));
}

absl::Status WaitForPort(Child& child, absl::Time deadline) {
  while (absl::Now() < deadline) {
    if (ReadPortFile(child)) return absl::OkStatus();
    if (auto status = child.proc.Poll(); status.has_value()) {
      return ExitedWhileStarting(child, *status);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(child.name, " did not start in time"));
}

// Stops the router first (it drains its streams), then the workers.
void StopAll(std::vector<Child>& children) {
  const absl::Duration grace =
      absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_seconds) + 2);
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    if (it->proc.running()) it->proc.Stop(grace);
  }
}

// One supervision step for a child: notices an exit, schedules and performs
// a restart on the same ports (the router's worker list and Prometheus
// targets stay valid), and reports when the restarted child is ready again.
void SuperviseChild(const std::string& self, const std::string& dir,
                    bool restart, Child& c) {
  const absl::Time now = absl::Now();
  if (c.restart_at.has_value()) {
    if (now < *c.restart_at) return;
    c.restart_at.reset();
    std::vector<std::string> flags = c.flags;
    // The same ports as before (later flags win).
    flags.push_back(absl::StrCat("--port=", c.port));
    if (c.metrics_port > 0) {
      flags.push_back(absl::StrCat("--metrics_port=", c.metrics_port));
    }
    if (c.http_port > 0) {
      flags.push_back(absl::StrCat("--http_port=", c.http_port));
    }
    const std::vector<std::string> original = c.flags;
    absl::Status s = StartChild(self, c.role, std::move(flags), dir, &c);
    c.flags = original;
    if (!s.ok()) {
      std::fprintf(stderr, "pdserve up: cannot restart %s: %s\n",
                   c.name.c_str(), s.ToString().c_str());
      c.restart_at = now + RestartBackoff(++c.restarts);
      return;
    }
    c.starting = true;
    std::fprintf(stderr, "pdserve up: %s restarted (pid %d, restart %d)\n",
                 c.name.c_str(), c.proc.pid(), c.restarts);
    return;
  }
  if (c.starting && ReadPortFile(c)) {
    c.starting = false;
    std::fprintf(stderr,
                 "pdserve up: %s (pid %d) serving again on 127.0.0.1:%d\n",
                 c.name.c_str(), c.proc.pid(), c.port);
  }
  if (!c.proc.running()) return;
  auto st = c.proc.Poll();
  if (!st.has_value()) return;
  const bool failed = !WIFEXITED(*st) || WEXITSTATUS(*st) != 0;
  c.ever_failed |= failed;
  std::fprintf(stderr, "pdserve up: %s (pid %d) %s; see %s/%s.log\n",
               c.name.c_str(), c.proc.pid(), DescribeWaitStatus(*st).c_str(),
               dir.c_str(), c.name.c_str());
  if (!restart || !failed) return;
  if (now - c.started >= kStableRun) c.restarts = 0;
  const absl::Duration delay = RestartBackoff(c.restarts);
  ++c.restarts;
  c.restart_at = now + delay;
  std::fprintf(stderr, "pdserve up: restarting %s in %s\n", c.name.c_str(),
               absl::FormatDuration(delay).c_str());
}

// The workers' KV pools (--kv_cache_memory each, a fraction taken of the
// memory available now) against what this machine can give them together.
absl::Status CheckKvPoolsFit(int workers) {
  const std::string per_worker = absl::GetFlag(FLAGS_kv_cache_memory);
  ASSIGN_OR_RETURN(const int64_t bytes, KvCacheBytesFromFlags());
  ASSIGN_OR_RETURN(const AvailableMemory available, AvailableMemoryNow());
  const double total = static_cast<double>(bytes) * workers;
  if (total <= static_cast<double>(available.bytes)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "--kv_cache_memory=%s for each of %d workers is %.1f GiB of KV pools "
      "in all, more than this machine can give: %s; give each less (at most "
      "%.2f of it, or fewer workers)",
      per_worker, workers, total / (1 << 30), available.Describe(),
      0.9 / workers));
}

int RunUp(const std::vector<std::string>&) {
  BlockTerminationSignals();
  SetLogRole("up");
  const int num_p = absl::GetFlag(FLAGS_prefill);
  const int num_d = absl::GetFlag(FLAGS_decode);
  // Checked here, not first by a child that exits while starting.
  if (auto transport = KvTransportModeFromFlags(); !transport.ok()) {
    return FailWith("up", transport.status());
  }
  const std::string restart_policy = absl::GetFlag(FLAGS_restart);
  if (restart_policy != "on-failure" && restart_policy != "never") {
    return FailWith("up", absl::InvalidArgumentError(absl::StrCat(
                              "--restart must be on-failure or never, got '",
                              restart_policy, "'")));
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  for (absl::Status s :
       {ParseRouterMode(mode).status(),
        CheckPortFlag("port", absl::GetFlag(FLAGS_port)),
        CheckPortFlag("http_port", absl::GetFlag(FLAGS_http_port))}) {
    if (!s.ok()) return FailWith("up", s);
  }
  if (num_d < 1 || num_p < 0 || (num_p == 0 && mode != "colocated")) {
    return FailWith(
        "up",
        absl::InvalidArgumentError(
            "need --decode >= 1 and --prefill >= 1 (or --mode=colocated)"));
  }
  // Each worker checks its own KV pool against the memory it can take, but
  // they start at once and see the same free memory: their pools together
  // must fit, or some are OOM-killed as the pools are made resident.
  if (absl::Status s = CheckKvPoolsFit(num_p + num_d); !s.ok()) {
    return FailWith("up", s);
  }
  absl::StatusOr<std::string> log_dir = MakeTempDirectory("pdserve-up-");
  if (!log_dir.ok()) {
    return FailWith("up",
                    absl::Status(log_dir.status().code(),
                                 absl::StrCat("children's logs: ",
                                              log_dir.status().message())));
  }
  const std::string dir = *log_dir;
  const std::string self = SelfExecutablePath();
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads == 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    const int workers = std::max(1, num_p + num_d);
    threads = std::max(1, cores / workers);
    // cores / workers == 1: at least as many cores as workers, fewer than
    // twice as many (more workers than cores keep one thread each).
    if (cores / workers == 1 && workers > 1) {
      // docs/performance.md, "served layout": on a quiet 2-core host a
      // prefill and a decode worker with 2 threads each (sharing the cores)
      // served 1.69x (bf16) and 1.35x (int8) the tokens/s of one thread
      // each: P idles between prompts, and D then runs on both cores.
      threads = 2;
      std::fprintf(stderr,
                   "pdserve up: %d cores for %d workers: each worker gets 2 "
                   "threads, sharing the cores (--threads=N sets it)\n",
                   cores, workers);
    }
    if (mode != "colocated" && num_p >= 1 && cores < 4) {
      // Same section: one colocated worker with both cores still served
      // 1.24x (bf16) the tokens/s of the shared split.
      std::fprintf(stderr,
                   "pdserve up: on a host this small, --mode=colocated "
                   "--prefill=0 (one worker, all cores) serves more tokens/s "
                   "(docs/performance.md, served layout)\n");
    }
  }
  const absl::Time deadline =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_seconds));
  std::vector<Child> children;
  children.reserve(num_p + num_d + 1);
  auto fail = [&](const absl::Status& s) {
    StopAll(children);
    std::fprintf(stderr, "pdserve up: logs in %s/\n", dir.c_str());
    return FailWith("up", s);
  };
  for (int i = 0; i < num_p + num_d; ++i) {
    const bool is_p = i < num_p;
    Child c;
    c.name =
        is_p ? absl::StrCat("prefill", i) : absl::StrCat("decode", i - num_p);
    auto flags = CommonChildFlags(is_p ? "prefill" : "decode", threads);
    flags.push_back("--port=0");
    for (auto& a : SplitArgs(
             absl::GetFlag(is_p ? FLAGS_prefill_args : FLAGS_decode_args))) {
      flags.push_back(std::move(a));
    }
    absl::Status s = StartChild(self, is_p ? "prefill" : "decode",
                                std::move(flags), dir, &c);
    children.push_back(std::move(c));
    if (!s.ok()) return fail(s);
  }
  std::vector<std::string> p_targets, d_targets;
  for (Child& c : children) {
    absl::Status s = WaitForPort(c, deadline);
    if (!s.ok()) return fail(s);
    (absl::StartsWith(c.name, "prefill") ? p_targets : d_targets)
        .push_back(absl::StrCat("127.0.0.1:", c.port));
  }
  {
    Child r;
    r.name = "router";
    auto flags = CommonChildFlags("router", threads);
    const int port = absl::GetFlag(FLAGS_port);
    flags.push_back(absl::StrCat("--port=", port < 0 ? 50051 : port));
    flags.push_back(absl::StrCat("--mode=", mode));
    flags.push_back(
        absl::StrCat("--http_port=", absl::GetFlag(FLAGS_http_port)));
    if (!absl::GetFlag(FLAGS_chat_template).empty()) {
      flags.push_back(
          absl::StrCat("--chat_template=", absl::GetFlag(FLAGS_chat_template)));
    }
    if (!p_targets.empty()) {
      flags.push_back(
          absl::StrCat("--prefill_workers=", absl::StrJoin(p_targets, ",")));
    }
    flags.push_back(
        absl::StrCat("--decode_workers=", absl::StrJoin(d_targets, ",")));
    for (const auto& [flag, value] :
         {std::pair{"tls_cert", absl::GetFlag(FLAGS_tls_cert)},
          std::pair{"tls_key", absl::GetFlag(FLAGS_tls_key)}}) {
      if (!value.empty()) flags.push_back(absl::StrCat("--", flag, "=", value));
    }
    for (auto& a : SplitArgs(absl::GetFlag(FLAGS_router_args)))
      flags.push_back(std::move(a));
    absl::Status s = StartChild(self, "router", std::move(flags), dir, &r);
    children.push_back(std::move(r));
    if (!s.ok()) return fail(s);
    s = WaitForPort(children.back(), deadline);
    if (!s.ok()) return fail(s);
  }
  Child& router = children.back();
  const std::string router_addr = absl::StrCat("127.0.0.1:", router.port);
  // Ready when the router sees every worker healthy.
  TlsFiles client_tls;
  client_tls.ca = absl::GetFlag(FLAGS_tls_cert);  // a self-signed router cert
  auto creds = MakeChannelCredentials(client_tls);
  if (!creds.ok()) return fail(creds.status());
  auto stub = v1::Generation::NewStub(MakeChannel(router_addr, *creds));
  absl::Status ready = absl::UnavailableError("not checked");
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    v1::GetModelInfoResponse info;
    grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (s.ok() &&
        info.num_prefill_workers() == static_cast<int>(p_targets.size()) &&
        info.num_decode_workers() == num_d) {
      ready = absl::OkStatus();
      break;
    }
    ready = s.ok() ? absl::UnavailableError("workers not healthy yet")
                   : FromGrpcStatus(s);
    for (Child& c : children) {
      if (auto st = c.proc.Poll(); st.has_value()) {
        return fail(ExitedWhileStarting(c, *st));
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!ready.ok()) return fail(ready);
  auto metrics_of = [](const Child& c) {
    return c.metrics_port > 0
               ? absl::StrCat(" metrics 127.0.0.1:", c.metrics_port)
               : std::string();
  };
  std::printf("pdserve up: router listening on %s (mode %s, pid %d)%s\n",
              router_addr.c_str(), mode.c_str(), router.proc.pid(),
              metrics_of(router).c_str());
  if (router.http_port > 0) {
    std::printf(
        "pdserve up: OpenAI-compatible HTTP API on http://127.0.0.1:%d/v1\n",
        router.http_port);
  }
  for (Child& c : children) {
    if (&c == &router) continue;
    std::printf("pdserve up:   %-9s 127.0.0.1:%d (pid %d)%s\n", c.name.c_str(),
                c.port, c.proc.pid(), metrics_of(c).c_str());
  }
  std::fflush(stdout);

  std::printf("pdserve up:   logs in %s/\n", dir.c_str());
  std::fflush(stdout);
  const std::string demo = absl::GetFlag(FLAGS_demo_prompt);
  if (!demo.empty()) {
    auto req = RequestFromFlags(demo, {});
    if (!req.ok()) return fail(req.status());
    std::printf("%s", demo.c_str());
    auto result =
        RunGenerate(*stub, *req, absl::Seconds(300), [](const std::string& t) {
          std::fwrite(t.data(), 1, t.size(), stdout);
          std::fflush(stdout);
        });
    std::printf("\n");
    std::fflush(stdout);  // the story before the summary on stderr
    StopAll(children);
    if (!result.ok()) {
      std::fprintf(stderr, "pdserve up: logs in %s/\n", dir.c_str());
      return FailWith("up", result.status());
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);  // logs are kept only on failure
    std::fprintf(
        stderr,
        "pdserve up: %d tokens, ttft %.1f ms, %.1f ms total; cluster stopped\n",
        result->usage.completion_tokens(), result->ttft_ms, result->e2e_ms);
    return 0;
  }
  std::printf("pdserve up: ready (Ctrl-C stops the cluster)\n");
  std::fflush(stdout);
  // Supervise until a signal: a child that fails is restarted on its ports
  // (--restart=on-failure), or reported and left down (never; the cluster
  // stops when the router is down).
  const bool restart = absl::GetFlag(FLAGS_restart) == "on-failure";
  int rc = 0;
  while (true) {
    if (auto sig = WaitForTerminationSignal(absl::Milliseconds(200));
        sig.has_value()) {
      std::fprintf(stderr, "pdserve up: signal %d, stopping the cluster\n",
                   *sig);
      break;
    }
    bool router_down = false;
    for (Child& c : children) {
      SuperviseChild(self, dir, restart, c);
      router_down |= &c == &router && !c.proc.running() && !c.restart_at;
    }
    if (router_down) {
      rc = 1;
      break;
    }
  }
  StopAll(children);
  std::fprintf(stderr, "pdserve up: stopped\n");
  std::string failed_children;
  for (const Child& c : children) {
    if (c.ever_failed) absl::StrAppend(&failed_children, " ", c.name);
  }
  if (rc == 0 && failed_children.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);  // logs are kept only on failure
  } else if (!failed_children.empty()) {
    std::fprintf(stderr, "pdserve up: logs kept in %s/ (failed:%s)\n",
                 dir.c_str(), failed_children.c_str());
  }
  return rc;
}

PDSERVE_SUBCOMMAND("up",
                   "run a local cluster (router + prefill + decode workers) as "
                   "child processes",
                   "pdserve up [--model=models/stories260K] [--prefill=1] "
                   "[--decode=1] [--port=50051] [--http_port=8000] "
                   "[--chat_template=FILE] [--restart=on-failure|never] "
                   "[--mode=disaggregated|colocated|auto] "
                   "[--demo_prompt=\"Once upon a time\"]",
                   FlagNames({SamplingFlagNames(),
                              {"model",
                               "tokenizer",
                               "dtype",
                               "quantization",
                               "kv_dtype",
                               "kv_cache_memory",
                               "block_size",
                               "threads",
                               "max_num_seqs",
                               "prefill_chunk_tokens",
                               "prefix_caching",
                               "kv_transport",
                               "port",
                               "http_port",
                               "mode",
                               "chat_template",
                               "drain_timeout_seconds",
                               "tls_cert",
                               "tls_key",
                               "internal_ca",
                               "internal_cert",
                               "internal_key"}}),
                   RunUp);

}  // namespace
}  // namespace pdserve
