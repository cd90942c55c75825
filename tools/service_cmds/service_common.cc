#include "tools/service_cmds/service_common.h"

#include <atomic>
#include <cstdio>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/util/fd_limit.h"
#include "common/util/logging.h"
#include "common/util/signals.h"
#include "common/util/status_macros.h"
#include "grpcpp/health_check_service_interface.h"
#include "tools/common_flags.h"

ABSL_FLAG(std::string, host, "0.0.0.0",
          "services: address to listen on (127.0.0.1 = loopback only)");
ABSL_FLAG(int32_t, port, -1,
          "services: gRPC port (-1 = the role's default: router 50051, "
          "prefill 50052, decode 50053; 0 = any free port, printed)");
ABSL_FLAG(std::string, port_file, "",
          "services: write the bound port to this file once serving");
ABSL_FLAG(int32_t, drain_timeout_seconds, 30,
          "services: on SIGTERM, how long in-flight work may take to finish");
ABSL_FLAG(std::string, internal_ca, "",
          "services: CA certificate (PEM) for mutual TLS between router, "
          "prefill and decode workers (empty = plaintext)");
ABSL_FLAG(std::string, internal_cert, "",
          "services: this process's certificate (PEM) for internal mTLS");
ABSL_FLAG(std::string, internal_key, "",
          "services: private key (PEM) of --internal_cert");
ABSL_FLAG(std::string, tls_cert, "",
          "router: certificate (PEM) of the public port (empty = plaintext); "
          "generate: CA/certificate to verify the router with");
ABSL_FLAG(std::string, tls_key, "", "router: private key (PEM) of --tls_cert");
ABSL_FLAG(std::string, mode, "disaggregated",
          "router/up: disaggregated | colocated (decode workers prefill) | "
          "auto (short prompts prefill on the decode worker)");
ABSL_FLAG(int32_t, metrics_port, 0,
          "services: Prometheus /metrics port (0 = disabled, -1 = any free "
          "port, printed and written to --port_file as \"metrics=PORT\")");

namespace pdserve {
namespace {

// The bound metrics port (0: not served), for the port file.
std::atomic<int> g_metrics_port{0};
std::atomic<int> g_http_port{0};

}  // namespace

std::vector<std::string> ServerFlagNames() {
  return {"host",
          "port",
          "port_file",
          "metrics_port",
          "drain_timeout_seconds",
          "internal_ca",
          "internal_cert",
          "internal_key"};
}

TlsFiles InternalTlsFromFlags() {
  TlsFiles t;
  t.ca = absl::GetFlag(FLAGS_internal_ca);
  t.cert = absl::GetFlag(FLAGS_internal_cert);
  t.key = absl::GetFlag(FLAGS_internal_key);
  return t;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
InternalServerCredentials() {
  TlsFiles t = InternalTlsFromFlags();
  return MakeServerCredentials(t, /*require_client_cert=*/!t.ca.empty());
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
InternalChannelCredentials() {
  return MakeChannelCredentials(InternalTlsFromFlags());
}

absl::Status CheckPortFlag(absl::string_view flag, int port) {
  if (port < -1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", port, " is not a port (-1 to 65535)"));
  }
  return absl::OkStatus();
}

absl::Status CheckServiceFlags() {
  RETURN_IF_ERROR(CheckPortFlag("port", absl::GetFlag(FLAGS_port)));
  RETURN_IF_ERROR(
      CheckPortFlag("metrics_port", absl::GetFlag(FLAGS_metrics_port)));
  if (absl::GetFlag(FLAGS_drain_timeout_seconds) < 0) {
    return absl::InvalidArgumentError(
        "--drain_timeout_seconds must be 0 (stop at once) or more");
  }
  return absl::OkStatus();
}

std::string ListenAddress(int default_port) {
  int port = absl::GetFlag(FLAGS_port);
  if (port < 0) port = default_port;
  return absl::StrCat(absl::GetFlag(FLAGS_host), ":", port);
}

int ServeUntilTerminated(grpc::Server& server, int port,
                         const std::string& role, const DrainHooks& hooks) {
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    // Write then rename, so a reader never sees a partial file.
    const std::string tmp = port_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << port << "\n";
      if (const int mp = g_metrics_port.load(); mp > 0) {
        out << "metrics=" << mp << "\n";
      }
      if (const int hp = g_http_port.load(); hp > 0) {
        out << "http=" << hp << "\n";
      }
    }
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::printf("pdserve %s listening on %s:%d\n", role.c_str(),
              absl::GetFlag(FLAGS_host).c_str(), port);
  std::fflush(stdout);
  std::optional<int> sig;
  std::optional<std::string> listener_failure;
  while (!(sig = WaitForTerminationSignal(absl::Seconds(1))).has_value()) {
    if ((listener_failure = GrpcListenerFailure()).has_value()) break;
  }
  if (listener_failure.has_value()) {
    // No new connection can ever reach this process: finish what runs on
    // the open ones, then exit non-zero so that a supervisor (`up`,
    // Kubernetes) starts a fresh one.
    PDSERVE_LOG_ERROR(
        "the gRPC listener on port %d stopped accepting connections (%s; "
        "gRPC 1.51 does not retry): draining (up to %ds), then exiting with "
        "status %d so that a supervisor restarts this process. Open-file "
        "limit: %lld; raise `ulimit -n` if that is what ran out",
        port, *listener_failure, absl::GetFlag(FLAGS_drain_timeout_seconds),
        kExitListenerFailed, static_cast<long long>(OpenFileLimit()));
  } else {
    PDSERVE_LOG_INFO("signal %d: draining (up to %ds)", *sig,
                     absl::GetFlag(FLAGS_drain_timeout_seconds));
  }
  if (auto* health = server.GetHealthCheckService())
    health->SetServingStatus(false);
  if (hooks.start_draining) hooks.start_draining();
  const absl::Time deadline =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_seconds));
  while (hooks.active && hooks.active() > 0 && absl::Now() < deadline) {
    // A second signal skips the rest of the drain.
    if (WaitForTerminationSignal(absl::Milliseconds(50)).has_value()) break;
  }
  const int left = hooks.active ? hooks.active() : 0;
  const std::string what = left <= 0 ? ""
                           : hooks.describe_active
                               ? hooks.describe_active()
                               : absl::StrCat(left, " requests");
  if (left > 0 && hooks.stop_in_flight) {
    PDSERVE_LOG_WARNING(
        "drain timeout: %s still in flight; ending them with UNAVAILABLE",
        what);
    hooks.stop_in_flight(absl::UnavailableError(absl::StrCat(
        role,
        " is stopping: the request was still running when the drain "
        "timeout (--drain_timeout_seconds=",
        absl::GetFlag(FLAGS_drain_timeout_seconds), ") passed; retry it")));
    // Long enough for the final messages to be written, not for a stuck
    // client to hold the stop.
    const absl::Time grace = absl::Now() + kStopInFlightGrace;
    while (hooks.active() > 0 && absl::Now() < grace) {
      if (WaitForTerminationSignal(absl::Milliseconds(20)).has_value()) break;
    }
  } else if (left > 0) {
    PDSERVE_LOG_WARNING("drain timeout: %s still in flight", what);
  }
  server.Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  PDSERVE_LOG_INFO("stopped");
  return listener_failure.has_value() ? kExitListenerFailed : 0;
}

absl::StatusOr<pdserve::v1::GenerateRequest> RequestFromFlags(
    const std::string& prompt, const std::vector<std::string>& prompt_ids) {
  pdserve::v1::GenerateRequest r;
  if (!prompt_ids.empty()) {
    for (const std::string& p : prompt_ids) {
      int32_t id;
      if (!absl::SimpleAtoi(p, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--prompt_ids: '", p, "' is not a token id"));
      }
      r.mutable_token_ids()->add_ids(id);
    }
  } else {
    r.set_text(prompt);
  }
  r.set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  auto* s = r.mutable_sampling();
  s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  s->set_top_k(absl::GetFlag(FLAGS_top_k));
  s->set_min_p(static_cast<float>(absl::GetFlag(FLAGS_min_p)));
  s->set_repetition_penalty(
      static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty)));
  s->set_presence_penalty(
      static_cast<float>(absl::GetFlag(FLAGS_presence_penalty)));
  s->set_frequency_penalty(
      static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty)));
  s->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  r.set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  r.set_top_logprobs(absl::GetFlag(FLAGS_top_logprobs));
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) r.add_stop(stop);
  for (const std::string& p : absl::GetFlag(FLAGS_stop_token_ids)) {
    int32_t id;
    if (!absl::SimpleAtoi(p, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stop_token_ids: '", p, "' is not a token id"));
    }
    r.add_stop_token_ids(id);
  }
  return r;
}

absl::StatusOr<std::unique_ptr<metrics::MetricsServer>>
StartMetricsFromFlags() {
  metrics::MetricsServerOptions o;
  o.port = absl::GetFlag(FLAGS_metrics_port);
  o.bind_address = absl::GetFlag(FLAGS_host);  // same interface as gRPC
  auto server = metrics::MetricsServer::Start(o);
  if (server.ok() && (*server)->serving()) {
    g_metrics_port.store((*server)->port());
    std::printf("pdserve metrics on port %d\n", (*server)->port());
  }
  return server;
}

void AnnounceHttpPort(int port) { g_http_port.store(port); }

void ReleaseMetricsServerAtExit(
    std::unique_ptr<metrics::MetricsServer> server) {
  // Deliberately never destroyed: the process exits right after.
  [[maybe_unused]] metrics::MetricsServer* leaked = server.release();
}

int FailWith(const std::string& role, const absl::Status& status) {
  std::fprintf(stderr, "pdserve %s: %s\n", role.c_str(),
               status.ToString().c_str());
  return 1;
}

}  // namespace pdserve
