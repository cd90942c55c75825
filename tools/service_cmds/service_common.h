// Flags and helpers shared by the service subcommands (router, prefill,
// decode, up, generate): listening address, port files, drain on SIGTERM,
// internal (m)TLS, engine options from the engine flags. Only built with gRPC.
#ifndef PDSERVE_TOOLS_SERVICE_CMDS_SERVICE_COMMON_H_
#define PDSERVE_TOOLS_SERVICE_CMDS_SERVICE_COMMON_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "common/grpc_util/grpc_util.h"
#include "common/metrics/metrics_server.h"
#include "pdserve/v1/generate.pb.h"
#include "tools/engine_flags.h"

ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(int32_t, port);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(int32_t, drain_timeout_seconds);
ABSL_DECLARE_FLAG(std::string, internal_ca);
ABSL_DECLARE_FLAG(std::string, internal_cert);
ABSL_DECLARE_FLAG(std::string, internal_key);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(int32_t, metrics_port);

namespace pdserve {

// --internal_ca/--internal_cert/--internal_key.
TlsFiles InternalTlsFromFlags();

// The flags of a serving role (prefill, decode, router) this file reads:
// listening (--host, --port, --port_file, --metrics_port), draining and
// internal TLS. A flag group for PDSERVE_SUBCOMMAND (tools/subcommand.h).
std::vector<std::string> ServerFlagNames();
// Server credentials of a worker's internal port (mTLS when --internal_ca).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
InternalServerCredentials();
// Channel credentials for internal calls (router -> workers, P -> D).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
InternalChannelCredentials();

// --host:--port (or `default_port` when --port is -1); --port was checked
// by CheckServiceFlags (gRPC would wrap one above 65535 modulo 65536).
std::string ListenAddress(int default_port);
// The flags every service takes (--port, --metrics_port,
// --drain_timeout_seconds), checked before a role loads anything.
absl::Status CheckServiceFlags();
// INVALID_ARGUMENT unless -1 <= `port` <= 65535 (-1: the default, 0: any
// free port), naming --`flag`.
absl::Status CheckPortFlag(absl::string_view flag, int port);

struct DrainHooks {
  std::function<void()> start_draining;  // stop accepting new work
  std::function<int()> active;           // work still in flight
  // At the drain timeout, work still in flight: end it with `why` so that
  // its clients get a status, not a cut connection (optional).
  std::function<void(const absl::Status& why)> stop_in_flight = nullptr;
  // What `active` counts, for the drain-timeout log (optional; default
  // "N requests"): the router's HTTP generations count in both of its
  // counters, so it says which is which.
  std::function<std::string()> describe_active = nullptr;
};
// How long a drain that timed out waits, after stop_in_flight, for the
// requests' final messages to be written.
inline constexpr absl::Duration kStopInFlightGrace = absl::Seconds(2);
// The exit status of a role whose gRPC listener stopped accepting
// connections (GrpcListenerFailure): a failure, so supervisors restart it.
inline constexpr int kExitListenerFailed = 3;
// Announces the bound port (stdout line + --port_file), serves until SIGINT
// or SIGTERM, or until the gRPC listener stopped accepting, then drains:
// health NOT_SERVING, start_draining(), waits up to --drain_timeout_seconds
// for active() == 0, then (work left) stop_in_flight() and up to
// kStopInFlightGrace more, shuts the server down. Returns the exit code (0, or
// kExitListenerFailed). Call BlockTerminationSignals() before starting
// threads.
int ServeUntilTerminated(grpc::Server& server, int port,
                         const std::string& role, const DrainHooks& hooks);

// The request the sampling/stopping flags describe, for a text prompt or ids.
absl::StatusOr<pdserve::v1::GenerateRequest> RequestFromFlags(
    const std::string& prompt, const std::vector<std::string>& prompt_ids);

// The process's Prometheus registry, served on --metrics_port (0: not
// served; -1: any free port). The metric bundles of common/metrics register
// into it. When served, the bound port is printed and remembered for the
// --port_file (second line "metrics=PORT").
absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> StartMetricsFromFlags();

// The router's HTTP port, written to the --port_file as "http=PORT" (call
// before ServeUntilTerminated).
void AnnounceHttpPort(int port);

// Call when the role has stopped serving, just before the process exits:
// the exporter is not stopped (civetweb takes ~2 s to join its threads after
// a scrape), so that SIGTERM exits promptly; the OS reclaims it at exit.
void ReleaseMetricsServerAtExit(std::unique_ptr<metrics::MetricsServer> server);

// "CODE: message" on stderr, exit code 1.
int FailWith(const std::string& role, const absl::Status& status);

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_SERVICE_CMDS_SERVICE_COMMON_H_
