#include "common/grpc_util/grpc_util.h"

#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/support/log.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace pdserve {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

std::string GrpcCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

// A PEM file's text: certificates (a chain or CA bundle) or a private key.
// gRPC takes anything and fails later without saying which file (a server
// then "cannot listen", a client never connects).
enum class Pem { kCertificates, kPrivateKey };
absl::StatusOr<std::string> ReadPem(const std::string& path, Pem kind) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  const bool ok = kind == Pem::kCertificates
                      ? absl::StrContains(text, "-----BEGIN CERTIFICATE-----")
                      : absl::StrContains(text, "-----BEGIN ") &&
                            absl::StrContains(text, "PRIVATE KEY-----");
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a PEM ",
        kind == Pem::kCertificates
            ? "certificate (no -----BEGIN CERTIFICATE----- line)"
            : "private key (no -----BEGIN ... PRIVATE KEY----- line)"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls, bool require_client_cert) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS server needs a certificate and a key");
  }
  grpc::SslServerCredentialsOptions opts(
      require_client_cert
          ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto cert = ReadPem(tls.cert, Pem::kCertificates);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(tls.key, Pem::kPrivateKey);
  if (!key.ok()) return key.status();
  pair.cert_chain = *std::move(cert);
  pair.private_key = *std::move(key);
  opts.pem_key_cert_pairs.push_back(std::move(pair));
  if (require_client_cert) {
    if (tls.ca.empty()) {
      return absl::InvalidArgumentError(
          "mutual TLS needs a CA (--internal_ca)");
    }
    auto ca = ReadPem(tls.ca, Pem::kCertificates);
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *std::move(ca);
  }
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  if (!tls.ca.empty()) {
    auto ca = ReadPem(tls.ca, Pem::kCertificates);
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *std::move(ca);
  }
  if (!tls.cert.empty()) {
    auto cert = ReadPem(tls.cert, Pem::kCertificates);
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(tls.key, Pem::kPrivateKey);
    if (!key.ok()) return key.status();
    opts.pem_cert_chain = *std::move(cert);
    opts.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(opts);
}

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& target,
    const std::shared_ptr<grpc::ChannelCredentials>& creds,
    int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly after a worker restarts.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Channels to different workers must not share a subchannel pool entry
  // that outlives the worker (keeps failures per worker).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(
      target, creds ? creds : grpc::InsecureChannelCredentials(), args);
}

namespace {

// Idle sync-server threads kept for the next requests (see StartServer).
constexpr int kMaxIdleHandlerThreads = 64;

absl::Mutex g_listener_failure_mu;
// Never destroyed: gRPC threads may still log while the process exits.
std::optional<std::string>& ListenerFailureLocked()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_listener_failure_mu) {
  static auto* failure = new std::optional<std::string>();
  return *failure;
}

// gRPC's log lines, in pdserve's format and at its levels. Each is printed:
// gRPC has already applied GRPC_VERBOSITY (default ERROR) before calling
// this, so GRPC_VERBOSITY=debug still shows gRPC's debug lines.
void RouteGrpcLog(gpr_log_func_args* args) {
  const absl::string_view file =
      args->file == nullptr ? "" : absl::string_view(args->file);
  const absl::string_view base = file.substr(file.rfind('/') + 1);
  const std::string line =
      absl::StrCat("grpc ", base, ":", args->line, ": ", args->message);
  LogLevel level = LogLevel::kInfo;
  if (args->severity == GPR_LOG_SEVERITY_ERROR) level = LogLevel::kError;
  if (args->severity == GPR_LOG_SEVERITY_DEBUG) level = LogLevel::kDebug;
  if (absl::StartsWith(args->message, "Failed accept4")) {
    absl::MutexLock lock(&g_listener_failure_mu);
    std::optional<std::string>& failure = ListenerFailureLocked();
    if (!failure.has_value()) failure = args->message;
  }
  LogLine(level, line);
}

}  // namespace

std::optional<std::string> GrpcListenerFailure() {
  absl::MutexLock lock(&g_listener_failure_mu);
  return ListenerFailureLocked();
}

absl::StatusOr<StartedServer> StartServer(const ServerOptions& options) {
  static std::once_flag route_log;
  std::call_once(route_log, [] { gpr_set_log_function(RouteGrpcLog); });
  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection)
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  StartedServer out;
  builder.AddListeningPort(
      options.address,
      options.creds ? options.creds : grpc::InsecureServerCredentials(),
      &out.port);
  builder.SetMaxReceiveMessageSize(options.max_receive_bytes);
  builder.SetMaxSendMessageSize(options.max_send_bytes);
  // gRPC sets SO_REUSEPORT by default: a second server on the same port
  // would silently share it (the kernel splitting clients between two
  // processes). A taken port must fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  // A sync handler runs on a thread of gRPC's pool, which keeps at most
  // MAX_POLLERS idle ones (2 by default): under load every request that
  // ends let its thread exit and every one that arrives created one.
  builder.SetSyncServerOption(
      grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
      kMaxIdleHandlerThreads);
  for (grpc::Service* s : options.services) builder.RegisterService(s);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.address,
        ": address already in use or not available (is another process on "
        "that port? pick another --port, or 0 for any free port), or its "
        "TLS certificate and key do not match"));
  }
  return out;
}

absl::Status CheckHealth(grpc::Channel& channel, absl::Duration timeout) {
  // The generated stub takes a shared_ptr; wrap without ownership.
  std::shared_ptr<grpc::Channel> alias(std::shared_ptr<grpc::Channel>(),
                                       &channel);
  auto stub = grpc::health::v1::Health::NewStub(alias);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat(
        "health: ", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                        resp.status())));
  }
  return absl::OkStatus();
}

absl::Status WaitForHealthy(
    const std::string& target,
    const std::shared_ptr<grpc::ChannelCredentials>& creds,
    absl::Duration timeout) {
  auto channel = MakeChannel(target, creds);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::UnavailableError("not checked");
  while (absl::Now() < deadline) {
    last = CheckHealth(*channel, absl::Seconds(1));
    if (last.ok()) return last;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(target, " not healthy: ", last.message()));
}

}  // namespace pdserve
