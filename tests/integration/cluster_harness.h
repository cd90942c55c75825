// Test harness for the multi-process integration tests: starts real
// `pdserve prefill|decode|router` processes (fork/exec of the built binary,
// PR_SET_PDEATHSIG) on loopback with ports chosen by the kernel, waits until
// each router sees every worker healthy, and kills every process it started
// when destroyed (also when a test fails). Not thread-safe except the
// router stubs, which gRPC makes thread-safe.
#ifndef PDSERVE_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
#define PDSERVE_TESTS_INTEGRATION_CLUSTER_HARNESS_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/prometheus_text.h"
#include "common/util/subprocess.h"
#include "grpcpp/security/credentials.h"
#include "nlohmann/json.hpp"
#include "pdserve/v1/generate.grpc.pb.h"
#include "pdserve/v1/worker.grpc.pb.h"
#include "tools/client/generate_client.h"

namespace pdserve::testing {

namespace v1 = ::pdserve::v1;
namespace pb = ::pdserve::v1::internal;

// Path of build/pdserve (compile definition).
std::string PdserveBinary();

// {"--kv_transport=X"} when the environment sets PDSERVE_TEST_KV_TRANSPORT=X
// (CTest runs the service tests once per transport; UCX_TLS, also from the
// environment, reaches the workers as it is), else none. The harness puts it
// first on every prefill and decode worker's command line.
std::vector<std::string> KvTransportFlagsFromEnv();

// The flags `pdserve ROLE` takes (from its --help; cached), and FLAGS
// ("--name=value") without those ROLE does not take: a subcommand refuses
// flags that are not its own.
std::set<std::string> FlagsOfRole(const std::string& role);
std::vector<std::string> KeepFlagsOf(const std::string& role,
                                     const std::vector<std::string>& flags);

// The whole file at `path` ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// True when process `pid` exists and is not a zombie.
bool ProcessAlive(int pid);

// A fresh temporary directory, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct ProcessSpec {
  std::string role;  // prefill | decode | router
  std::vector<std::string> flags;
  // Runs the binary through this command (absolute path first), e.g.
  // {"/usr/sbin/ip", "netns", "exec", NAME, "/usr/bin/env", "UCX_TLS=tcp"};
  // it must exec the binary in the same process (signals go to its PID).
  std::vector<std::string> wrapper = {};
};

// One started role process and its port.
struct RoleProcess {
  std::string name;
  Subprocess proc;
  int port = 0;
  int metrics_port = 0;  // with --metrics_port=-1 (port file "metrics=N")
  int http_port = 0;     // routers: the HTTP API (port file "http=N")
  std::string log_path;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

// Starts `spec` with --port=0 --port_file and waits for the port.
absl::StatusOr<std::unique_ptr<RoleProcess>> StartRole(const ProcessSpec& spec,
                                                       const std::string& name,
                                                       const std::string& dir);

struct ClusterOptions {
  int prefill = 1;
  int decode = 1;
  std::vector<std::string> modes = {"disaggregated"};  // one router per mode
  std::vector<std::string> common_flags;               // every process
  std::vector<std::string> prefill_flags;              // every prefill worker
  std::vector<std::string> decode_flags;               // every decode worker
  // Extra flags of decode worker i (after decode_flags), for clusters whose
  // workers differ.
  std::map<int, std::vector<std::string>> decode_flags_of;
  std::vector<std::string> router_flags;  // every router
  // Credentials the harness uses for the routers' public port and for
  // internal status calls (TLS tests); insecure by default.
  std::shared_ptr<grpc::ChannelCredentials> router_creds;
  std::shared_ptr<grpc::ChannelCredentials> internal_creds;
};

class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(
      const ClusterOptions& options);
  ~Cluster();  // SIGKILLs and reaps whatever is still running

  v1::Generation::Stub& router(int i = 0) { return *router_stubs_[i]; }
  RoleProcess& router_process(int i = 0) { return *routers_[i]; }
  RoleProcess& prefill(int i) { return *prefill_[i]; }
  RoleProcess& decode(int i) { return *decode_[i]; }
  int num_prefill() const { return static_cast<int>(prefill_.size()); }
  int num_decode() const { return static_cast<int>(decode_.size()); }

  absl::StatusOr<pb::WorkerStatusResponse> Status(const RoleProcess& worker);
  // Waits until every live worker reports all KV blocks free and no pending
  // leases; returns the last statuses on timeout as an error message.
  absl::Status WaitForNoKvInUse(absl::Duration timeout);
  // The last lines of every process's log (for failure messages).
  std::string Logs() const;

 private:
  Cluster() = default;
  ClusterOptions options_;
  TempDir dir_;
  std::vector<std::unique_ptr<RoleProcess>> prefill_, decode_, routers_;
  std::vector<std::unique_ptr<v1::Generation::Stub>> router_stubs_;
};

// The role's /metrics (it must run with --metrics_port=-1). Empty samples,
// with the error on stderr, when the scrape fails (the caller's EXPECTs on
// the values then fail).
metrics::PrometheusSamples ScrapeRole(const RoleProcess& p);

// A prompt of models/stories260K/reference_greedy.jsonl.
struct ReferenceCase {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  int max_new_tokens = 0;
};
std::vector<ReferenceCase> LoadReferenceCases();

// A request for token ids; greedy unless sampling is set afterwards.
v1::GenerateRequest IdsRequest(const std::vector<int32_t>& ids, int max_tokens);

// Runs `argv` (absolute path first) to completion and returns its stdout;
// an error with its output when it exits non-zero or outlives `timeout`.
absl::StatusOr<std::string> RunCapture(const std::vector<std::string>& argv,
                                       absl::Duration timeout);

// Resident memory of process `pid` (VmRSS in /proc/PID/status), in KiB; 0
// when unreadable.
int64_t ResidentKiB(pid_t pid);

// Runs `pdserve complete` with `args` and returns its stdout.
absl::StatusOr<std::string> RunPdserveCapture(
    const std::vector<std::string>& args, absl::Duration timeout);

// The JSON line `pdserve complete --json --threads=1 <flags>` prints for
// one request (checked to hold output_ids).
absl::StatusOr<nlohmann::json> CompleteJson(
    const std::vector<std::string>& flags);

// The output ids of `pdserve complete --json --threads=1 --prompt_ids=<ids>
// <flags>`: the in-process engine's answer, the reference for a request sent
// to a cluster with the same sampling flags.
absl::StatusOr<std::vector<int32_t>> CompleteOutputIds(
    const std::vector<int32_t>& ids, const std::vector<std::string>& flags);

}  // namespace pdserve::testing

#endif  // PDSERVE_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
