#include "tests/integration/cluster_harness.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "nlohmann/json.hpp"

namespace pdserve::testing {

std::string PdserveBinary() { return PDSERVE_BINARY; }

std::vector<std::string> KvTransportFlagsFromEnv() {
  const char* t = getenv("PDSERVE_TEST_KV_TRANSPORT");
  if (t == nullptr || *t == '\0') return {};
  return {absl::StrCat("--kv_transport=", t)};
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ProcessAlive(int pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() &&
         stat[close + 2] != 'Z';
}

std::set<std::string> FlagsOfRole(const std::string& role) {
  static absl::Mutex mu;
  static auto* cache = new std::map<std::string, std::set<std::string>>();
  absl::MutexLock lock(&mu);
  auto it = cache->find(role);
  if (it != cache->end()) return it->second;
  std::set<std::string> names;
  FILE* p = popen(
      absl::StrCat(PdserveBinary(), " ", role, " --help 2>/dev/null").c_str(),
      "r");
  if (p != nullptr) {
    char line[4096];
    while (fgets(line, sizeof(line), p) != nullptr) {
      absl::string_view l = line;
      if (!absl::ConsumePrefix(&l, "  --")) continue;
      names.insert(std::string(l.substr(0, l.find(' '))));
    }
    pclose(p);
  }
  (*cache)[role] = names;
  return names;
}

std::vector<std::string> KeepFlagsOf(const std::string& role,
                                     const std::vector<std::string>& flags) {
  const std::set<std::string> takes = FlagsOfRole(role);
  std::vector<std::string> out;
  for (const std::string& f : flags) {
    absl::string_view name = f;
    absl::ConsumePrefix(&name, "--");
    name = name.substr(0, name.find('='));
    if (takes.count(std::string(name))) out.push_back(f);
  }
  return out;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/pdserve-test-XXXXXX";
  path_ = mkdtemp(tmpl);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::StatusOr<std::unique_ptr<RoleProcess>> StartRole(const ProcessSpec& spec,
                                                       const std::string& name,
                                                       const std::string& dir) {
  auto rp = std::make_unique<RoleProcess>();
  rp->name = name;
  rp->log_path = absl::StrCat(dir, "/", name, ".log");
  const std::string port_file = absl::StrCat(dir, "/", name, ".port");
  std::vector<std::string> argv = spec.wrapper;
  argv.push_back(PdserveBinary());
  argv.push_back(spec.role);
  for (std::string a :
       KeepFlagsOf(spec.role, {"--port=0", "--host=127.0.0.1", "--threads=1",
                               // A router's HTTP API is off unless the test
                               // asks (its default, 8000, is one fixed port
                               // for every test running at once).
                               "--http_port=-1",
                               absl::StrCat("--port_file=", port_file)})) {
    argv.push_back(std::move(a));
  }
  argv.insert(argv.end(), spec.flags.begin(), spec.flags.end());
  SubprocessOptions so;
  so.stdout_path = rp->log_path;
  so.stderr_path = rp->log_path;
  auto proc = Subprocess::Start(argv, so);
  if (!proc.ok()) return proc.status();
  rp->proc = *std::move(proc);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    std::string text;
    if (in && std::getline(in, text) && absl::SimpleAtoi(text, &rp->port) &&
        rp->port > 0) {
      while (std::getline(in, text)) {
        absl::string_view rest = text;
        if (absl::ConsumePrefix(&rest, "metrics=")) {
          (void)absl::SimpleAtoi(rest, &rp->metrics_port);
        } else if (absl::ConsumePrefix(&rest, "http=")) {
          (void)absl::SimpleAtoi(rest, &rp->http_port);
        }
      }
      return rp;
    }
    if (auto st = rp->proc.Poll(); st.has_value()) {
      std::ifstream log(rp->log_path);
      std::stringstream ss;
      ss << log.rdbuf();
      return absl::UnavailableError(absl::StrCat(
          name, " ", DescribeWaitStatus(*st), " while starting:\n", ss.str()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(name, " did not start"));
}

metrics::PrometheusSamples ScrapeRole(const RoleProcess& p) {
  if (p.metrics_port <= 0) {
    std::fprintf(stderr, "%s reported no metrics port\n", p.name.c_str());
    return metrics::PrometheusSamples();
  }
  auto s = metrics::ScrapeMetrics("127.0.0.1", p.metrics_port);
  if (!s.ok()) {
    std::fprintf(stderr, "scraping %s: %s\n", p.name.c_str(),
                 s.status().ToString().c_str());
    return metrics::PrometheusSamples();
  }
  return *std::move(s);
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(
    const ClusterOptions& options) {
  std::unique_ptr<Cluster> c(new Cluster());
  c->options_ = options;
  if (!c->options_.router_creds)
    c->options_.router_creds = grpc::InsecureChannelCredentials();
  if (!c->options_.internal_creds) {
    c->options_.internal_creds = grpc::InsecureChannelCredentials();
  }
  // A role gets the common flags it takes (as `up` hands its flags on), then
  // its own, unfiltered.
  auto flags = [&](const std::string& role,
                   const std::vector<std::string>& extra) {
    std::vector<std::string> f = KeepFlagsOf(role, options.common_flags);
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  // Workers: the KV transport the test run asks for first, so that a test's
  // own --kv_transport (later on the command line) wins.
  auto worker_flags = [&](const std::string& role,
                          const std::vector<std::string>& extra) {
    std::vector<std::string> f = KvTransportFlagsFromEnv();
    for (std::string& x : flags(role, extra)) f.push_back(std::move(x));
    return f;
  };
  for (int i = 0; i < options.prefill; ++i) {
    auto p =
        StartRole({"prefill", worker_flags("prefill", options.prefill_flags)},
                  absl::StrCat("prefill", i), c->dir_.path());
    if (!p.ok()) return p.status();
    c->prefill_.push_back(*std::move(p));
  }
  for (int i = 0; i < options.decode; ++i) {
    std::vector<std::string> own = options.decode_flags;
    if (auto it = options.decode_flags_of.find(i);
        it != options.decode_flags_of.end()) {
      own.insert(own.end(), it->second.begin(), it->second.end());
    }
    auto d = StartRole({"decode", worker_flags("decode", own)},
                       absl::StrCat("decode", i), c->dir_.path());
    if (!d.ok()) return d.status();
    c->decode_.push_back(*std::move(d));
  }
  std::vector<std::string> p_addr, d_addr;
  for (auto& p : c->prefill_) p_addr.push_back(p->address());
  for (auto& d : c->decode_) d_addr.push_back(d->address());
  for (size_t i = 0; i < options.modes.size(); ++i) {
    // The HTTP API is off (StartRole) unless router_flags ask for it.
    std::vector<std::string> rf;
    for (std::string& f : flags("router", options.router_flags))
      rf.push_back(std::move(f));
    rf.push_back(absl::StrCat("--mode=", options.modes[i]));
    rf.push_back("--worker_poll_ms=100");
    if (!p_addr.empty())
      rf.push_back("--prefill_workers=" + absl::StrJoin(p_addr, ","));
    rf.push_back("--decode_workers=" + absl::StrJoin(d_addr, ","));
    auto r =
        StartRole({"router", rf}, absl::StrCat("router", i), c->dir_.path());
    if (!r.ok()) return r.status();
    c->router_stubs_.push_back(v1::Generation::NewStub(
        MakeChannel((*r)->address(), c->options_.router_creds)));
    c->routers_.push_back(*std::move(r));
  }
  // Ready when every router sees every worker healthy.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (size_t i = 0; i < c->routers_.size(); ++i) {
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      v1::GetModelInfoResponse info;
      grpc::Status s = c->router_stubs_[i]->GetModelInfo(&ctx, {}, &info);
      if (s.ok() && info.num_decode_workers() == options.decode &&
          info.num_prefill_workers() == options.prefill) {
        break;
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "cluster not healthy: ", s.error_message(), "\n", c->Logs()));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  return c;
}

Cluster::~Cluster() {
  // Routers first, then workers; SIGKILL (a test must never leave processes).
  for (auto* group : {&routers_, &prefill_, &decode_}) {
    for (auto& p : *group) {
      if (p->proc.running()) p->proc.Signal(SIGKILL);
    }
  }
  for (auto* group : {&routers_, &prefill_, &decode_}) {
    for (auto& p : *group) (void)p->proc.Wait(absl::InfiniteDuration());
  }
}

absl::StatusOr<pb::WorkerStatusResponse> Cluster::Status(
    const RoleProcess& worker) {
  auto stub = pb::Worker::NewStub(
      MakeChannel(worker.address(), options_.internal_creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  pb::WorkerStatusResponse resp;
  grpc::Status s = stub->Status(&ctx, pb::WorkerStatusRequest(), &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::Status Cluster::WaitForNoKvInUse(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (true) {
    bool clean = true;
    last.clear();
    for (auto* group : {&prefill_, &decode_}) {
      for (auto& w : *group) {
        w->proc.Poll();  // reap a worker a test killed
        if (!w->proc.running()) continue;
        auto st = Status(*w);
        if (!st.ok()) return st.status();
        absl::StrAppend(&last, w->name, ": free ", st->free_kv_blocks(), "/",
                        st->total_kv_blocks(), " pending_leases ",
                        st->pending_leases(), "; ");
        if (st->free_kv_blocks() != st->total_kv_blocks() ||
            st->pending_leases() != 0) {
          clean = false;
        }
      }
    }
    if (clean) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("KV still in use: ", last));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

std::string Cluster::Logs() const {
  std::string out;
  for (auto* group : {&routers_, &prefill_, &decode_}) {
    for (auto& p : *group) {
      std::ifstream in(p->log_path);
      std::vector<std::string> lines;
      for (std::string l; std::getline(in, l);) lines.push_back(l);
      const size_t from = lines.size() > 15 ? lines.size() - 15 : 0;
      absl::StrAppend(&out, "---- ", p->name, " ----\n");
      for (size_t i = from; i < lines.size(); ++i)
        absl::StrAppend(&out, lines[i], "\n");
    }
  }
  return out;
}

std::vector<ReferenceCase> LoadReferenceCases() {
  std::vector<ReferenceCase> out;
  std::ifstream in("models/stories260K/reference_greedy.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    ReferenceCase c;
    c.prompt = j.at("prompt").get<std::string>();
    c.prompt_ids = j.at("prompt_ids").get<std::vector<int32_t>>();
    c.output_ids = j.at("output_ids").get<std::vector<int32_t>>();
    c.max_new_tokens = j.at("max_new_tokens").get<int>();
    out.push_back(std::move(c));
  }
  return out;
}

v1::GenerateRequest IdsRequest(const std::vector<int32_t>& ids,
                               int max_tokens) {
  v1::GenerateRequest r;
  for (int32_t id : ids) r.mutable_token_ids()->add_ids(id);
  r.set_max_tokens(max_tokens);
  r.mutable_sampling()->set_temperature(0.0f);
  return r;
}

absl::StatusOr<nlohmann::json> CompleteJson(
    const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"complete", "--json", "--threads=1"};
  args.insert(args.end(), flags.begin(), flags.end());
  auto out = RunPdserveCapture(args, absl::Seconds(60));
  if (!out.ok()) return out.status();
  auto j = nlohmann::json::parse(*out, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("output_ids")) {
    return absl::InternalError("pdserve complete printed no output_ids: " +
                               *out);
  }
  return j;
}

absl::StatusOr<std::vector<int32_t>> CompleteOutputIds(
    const std::vector<int32_t>& ids, const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"--prompt_ids=" + absl::StrJoin(ids, ",")};
  args.insert(args.end(), flags.begin(), flags.end());
  auto j = CompleteJson(args);
  if (!j.ok()) return j.status();
  return j->at("output_ids").get<std::vector<int32_t>>();
}

int64_t ResidentKiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int64_t kib = 0;
    if (absl::StartsWith(line, "VmRSS:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(
                             absl::string_view(line).substr(6), "kB")),
                         &kib)) {
      return kib;
    }
  }
  return 0;
}

absl::StatusOr<std::string> RunPdserveCapture(
    const std::vector<std::string>& args, absl::Duration timeout) {
  std::vector<std::string> argv = {PdserveBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCapture(argv, timeout);
}

absl::StatusOr<std::string> RunCapture(const std::vector<std::string>& argv,
                                       absl::Duration timeout) {
  TempDir dir;
  const std::string out_path = dir.path() + "/out";
  SubprocessOptions so;
  so.stdout_path = out_path;
  so.stderr_path = dir.path() + "/err";
  auto proc = Subprocess::Start(argv, so);
  if (!proc.ok()) return proc.status();
  auto st = proc->Wait(timeout);
  if (!st.ok()) return st.status();
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
    std::ifstream err_in(so.stderr_path);
    std::stringstream err;
    err << err_in.rdbuf();
    return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), " ",
                                            DescribeWaitStatus(*st), ": ",
                                            ss.str(), err.str()));
  }
  return ss.str();
}

}  // namespace pdserve::testing
