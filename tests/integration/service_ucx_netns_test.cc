// UCX over TCP between two "hosts" (issue 18): the test creates two network
// namespaces (names with its PID; loopback up in each) joined by a veth
// pair, runs the prefill worker and the router in one and the decode worker
// in the other, each with UCX_TLS=tcp and UCX_NET_DEVICES naming its end of
// the veth, and checks that greedy outputs equal the reference and
// `pdserve complete`, that every push went over UCX (the prefill worker's
// metrics) and that the decode worker's veth received at least the KV bytes
// (UCX's gets crossed the link; the gRPC control stream carries only chunk
// references). It deletes the namespaces it made even when it fails (and, at
// start, those a killed earlier run left behind), and stops its processes by
// PID. Needs root and iproute2.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/metrics/prometheus_text.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

constexpr char kPrefix[] = "pdserve-ucx-";

std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

absl::Status Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {IpBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCapture(argv, absl::Seconds(20)).status();
}

// Deletes namespaces named kPrefix<pid>-* whose pid is not alive (a run
// killed before its cleanup).
void SweepStaleNamespaces() {
  auto list = RunCapture({IpBinary(), "netns", "list"}, absl::Seconds(10));
  if (!list.ok()) return;
  for (absl::string_view line : absl::StrSplit(*list, '\n')) {
    absl::string_view name = line.substr(0, line.find(' '));
    if (!absl::ConsumePrefix(&name, kPrefix)) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(name.substr(0, name.find('-')), &pid)) continue;
    if (kill(pid, 0) != 0 && errno == ESRCH) {
      (void)Ip({"netns", "del", absl::StrCat(kPrefix, name)});
    }
  }
}

// Two namespaces, a veth pair between them (10.77.0.1/24 in `a`,
// 10.77.0.2/24 in `b`), loopback up in each; deleted by the destructor.
class NamespacePair {
 public:
  static absl::StatusOr<std::unique_ptr<NamespacePair>> Create() {
    std::unique_ptr<NamespacePair> n(new NamespacePair());
    const pid_t pid = getpid();
    n->a_ = absl::StrCat(kPrefix, pid, "-a");
    n->b_ = absl::StrCat(kPrefix, pid, "-b");
    n->veth_a_ = absl::StrCat("pdu", pid, "a");  // <= 15 characters
    n->veth_b_ = absl::StrCat("pdu", pid, "b");
    for (const std::vector<std::string>& cmd :
         std::vector<std::vector<std::string>>{
             {"netns", "add", n->a_},
             {"netns", "add", n->b_},
             {"link", "add", n->veth_a_, "type", "veth", "peer", "name",
              n->veth_b_},
             {"link", "set", n->veth_a_, "netns", n->a_},
             {"link", "set", n->veth_b_, "netns", n->b_},
             {"-n", n->a_, "addr", "add", "10.77.0.1/24", "dev", n->veth_a_},
             {"-n", n->b_, "addr", "add", "10.77.0.2/24", "dev", n->veth_b_},
             {"-n", n->a_, "link", "set", "lo", "up"},
             {"-n", n->b_, "link", "set", "lo", "up"},
             {"-n", n->a_, "link", "set", n->veth_a_, "up"},
             {"-n", n->b_, "link", "set", n->veth_b_, "up"}}) {
      if (absl::Status s = Ip(cmd); !s.ok()) return s;  // destructor cleans
    }
    return n;
  }
  ~NamespacePair() {
    // Deleting a namespace removes its end of the veth, and with it the
    // pair; a veth never moved (setup failed early) is deleted by name.
    (void)Ip({"netns", "del", a_});
    (void)Ip({"netns", "del", b_});
    (void)Ip({"link", "del", veth_a_});
  }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& veth_a() const { return veth_a_; }
  const std::string& veth_b() const { return veth_b_; }

  // Runs a command inside namespace `ns` with the given environment.
  std::vector<std::string> Exec(const std::string& ns,
                                const std::vector<std::string>& env) const {
    std::vector<std::string> w = {IpBinary(), "netns", "exec", ns,
                                  "/usr/bin/env"};
    w.insert(w.end(), env.begin(), env.end());
    return w;
  }

  // Bytes received on `dev` in `ns` (ip -s -j link).
  absl::StatusOr<int64_t> RxBytes(const std::string& ns,
                                  const std::string& dev) const {
    auto out = RunCapture(
        {IpBinary(), "-n", ns, "-s", "-j", "link", "show", "dev", dev},
        absl::Seconds(10));
    if (!out.ok()) return out.status();
    auto j = nlohmann::json::parse(*out, nullptr, false);
    if (!j.is_array() || j.empty()) {
      return absl::InternalError("ip -j link printed: " + *out);
    }
    return j[0]["stats64"]["rx"]["bytes"].get<int64_t>();
  }

 private:
  NamespacePair() = default;
  std::string a_, b_, veth_a_, veth_b_;
};

TEST(UcxNetnsTest, UcxTcpCrossesAVethBetweenTwoNamespaces) {
  ASSERT_EQ(geteuid(), 0u) << "needs root (ip netns); run as root";
  ASSERT_FALSE(IpBinary().empty()) << "needs iproute2 (ip)";
  SweepStaleNamespaces();
  auto ns = NamespacePair::Create();
  ASSERT_TRUE(ns.ok()) << ns.status();
  const NamespacePair& n = **ns;
  TempDir dir;
  const std::vector<std::string> common = {"--metrics_port=-1",
                                           "--kv_transport=ucx"};
  auto start = [&](const std::string& role, const std::string& nsname,
                   const std::string& veth, std::vector<std::string> flags) {
    ProcessSpec spec;
    spec.role = role;
    spec.flags = KeepFlagsOf(role, common);  // the router has no KV transport
    spec.flags.insert(spec.flags.end(), flags.begin(), flags.end());
    spec.wrapper =
        n.Exec(nsname, {"UCX_TLS=tcp", absl::StrCat("UCX_NET_DEVICES=", veth)});
    return StartRole(spec, role, dir.path());
  };
  // The decode worker alone in namespace b, listening on its veth address.
  auto d = start("decode", n.b(), n.veth_b(), {"--host=10.77.0.2"});
  ASSERT_TRUE(d.ok()) << d.status();
  auto p = start("prefill", n.a(), n.veth_a(), {"--host=10.77.0.1"});
  ASSERT_TRUE(p.ok()) << p.status();
  auto r = start("router", n.a(), n.veth_a(),
                 {"--mode=disaggregated", "--worker_poll_ms=100",
                  absl::StrCat("--prefill_workers=10.77.0.1:", (*p)->port),
                  absl::StrCat("--decode_workers=10.77.0.2:", (*d)->port)});
  ASSERT_TRUE(r.ok()) << r.status();
  auto logs = [&] {
    std::string out;
    for (const RoleProcess* proc : {d->get(), p->get(), r->get()}) {
      auto text = RunCapture({"/usr/bin/tail", "-n", "15", proc->log_path},
                             absl::Seconds(5));
      absl::StrAppend(&out, "---- ", proc->name, " ----\n", text.value_or(""));
    }
    return out;
  };
  auto rx_before = n.RxBytes(n.b(), n.veth_b());
  ASSERT_TRUE(rx_before.ok()) << rx_before.status();

  const std::vector<ReferenceCase> cases = LoadReferenceCases();
  ASSERT_GE(cases.size(), 3u);
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < 3; ++i) {
    const ReferenceCase& c = cases[i];
    std::vector<std::string> argv =
        n.Exec(n.a(), {});  // the client runs next to the router
    for (std::string a :
         {PdserveBinary(), std::string("generate"),
          absl::StrCat("--target=127.0.0.1:", (*r)->port),
          std::string("--json"), std::string("--temperature=0"),
          absl::StrCat("--max_tokens=", c.max_new_tokens),
          absl::StrCat("--prompt_ids=", absl::StrJoin(c.prompt_ids, ","))}) {
      argv.push_back(std::move(a));
    }
    // The router needs a poll or two to see both workers.
    absl::StatusOr<std::string> out = absl::UnavailableError("not run");
    for (int attempt = 0; attempt < 60; ++attempt) {
      out = RunCapture(argv, absl::Seconds(60));
      if (out.ok() || !absl::StrContains(out.status().message(), "UNAVAIL")) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
    ASSERT_TRUE(out.ok()) << out.status() << logs();
    auto j = nlohmann::json::parse(*out, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("output_ids")) << *out;
    const auto ids = j["output_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, c.output_ids) << "case " << i;
    auto complete = CompleteOutputIds(
        c.prompt_ids,
        {absl::StrCat("--max_tokens=", c.max_new_tokens), "--temperature=0"});
    ASSERT_TRUE(complete.ok()) << complete.status();
    EXPECT_EQ(ids, *complete) << "case " << i;
    prompt_tokens += static_cast<int64_t>(c.prompt_ids.size());
  }

  // Every push went over UCX, as the prefill worker counts them (scraped
  // from inside its namespace).
  std::vector<std::string> scrape = n.Exec(n.a(), {});
  scrape.push_back("/usr/bin/curl");
  scrape.push_back("-sf");
  scrape.push_back(
      absl::StrCat("http://10.77.0.1:", (*p)->metrics_port, "/metrics"));
  auto text = RunCapture(scrape, absl::Seconds(20));
  ASSERT_TRUE(text.ok()) << text.status();
  auto samples = metrics::ParsePrometheusText(*text);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(samples->Get("pdserve_kv_pushes_total", {{"transport", "ucx"}}), 3);
  const double kv_bytes = samples->Sum("pdserve_kv_pushed_bytes_total");
  EXPECT_GT(kv_bytes, 0);
  EXPECT_EQ(
      samples->Get("pdserve_kv_pushed_bytes_total", {{"transport", "ucx"}}),
      kv_bytes);
  // ...and its bytes crossed the veth into namespace b.
  auto rx_after = n.RxBytes(n.b(), n.veth_b());
  ASSERT_TRUE(rx_after.ok()) << rx_after.status();
  EXPECT_GE(*rx_after - *rx_before, static_cast<int64_t>(kv_bytes))
      << "the decode worker's veth received less than the KV";
  EXPECT_GT(prompt_tokens, 0);
}

}  // namespace
}  // namespace pdserve::testing
