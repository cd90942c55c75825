// gRPC glue shared by every service process and client: the single place where
// absl::Status and grpc::Status are mapped onto each other, TLS / mTLS
// credentials, channels and servers with explicit message-size limits, and a
// grpc.health.v1 check client. Stateless functions: thread-safe.
#ifndef PDSERVE_COMMON_GRPC_UTIL_GRPC_UTIL_H_
#define PDSERVE_COMMON_GRPC_UTIL_GRPC_UTIL_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/support/status.h"

namespace pdserve {

// Largest message on internal channels (KV chunks are far smaller: the
// sender splits layers into chunks of at most kKvChunkTargetBytes).
inline constexpr int kInternalMaxMessageBytes = 64 << 20;

// absl <-> gRPC status (the code spaces are the same; messages are kept).
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
// "UNAVAILABLE: message" for logs and CLI errors.
std::string GrpcCodeName(grpc::StatusCode code);

// TLS material, as file paths. Empty cert/key = plaintext.
struct TlsFiles {
  std::string ca;    // CA that signs peers (mTLS: required of clients)
  std::string cert;  // this process's certificate chain (PEM)
  std::string key;   // its private key (PEM)
  bool enabled() const { return !cert.empty() || !ca.empty(); }
};

absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Server credentials: insecure when !tls.enabled(); TLS with tls.cert/key;
// when `require_client_cert`, clients must present a certificate signed by
// tls.ca (mutual TLS).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls, bool require_client_cert);
// Channel credentials: insecure when !tls.enabled(); otherwise verify the
// server with tls.ca (system roots when empty) and present tls.cert/key when
// given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& tls);

// A channel with explicit message-size limits and keepalive (so a dead peer
// is noticed quickly).
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& target,
    const std::shared_ptr<grpc::ChannelCredentials>& creds,
    int max_message_bytes = kInternalMaxMessageBytes);

struct ServerOptions {
  std::string address = "0.0.0.0:0";
  std::shared_ptr<grpc::ServerCredentials> creds;  // null = insecure
  int max_receive_bytes = kInternalMaxMessageBytes;
  int max_send_bytes = kInternalMaxMessageBytes;
  bool reflection = false;
  std::vector<grpc::Service*> services;
};
struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
// Builds and starts a server with the default grpc.health.v1 service
// (SERVING) and, when asked, server reflection. Also routes gRPC's own log
// lines through pdserve's log (common/util/logging.h), once per process.
absl::StatusOr<StartedServer> StartServer(const ServerOptions& options);

// gRPC 1.51 gives up on a listening socket when accept fails with anything
// but EAGAIN, ECONNABORTED or EINTR (EMFILE above all: out of descriptors):
// the port stays bound and no connection is accepted again, while those
// already open keep working. Its one trace is the log line "Failed
// accept4: ..."; the log route StartServer installs watches for it. Returns
// that line once it was logged (nullopt before). Thread-safe.
std::optional<std::string> GrpcListenerFailure();

// grpc.health.v1 Check of the overall server (service ""). OK when SERVING,
// UNAVAILABLE (with the reason) otherwise.
absl::Status CheckHealth(grpc::Channel& channel, absl::Duration timeout);

// Waits until a channel answers SERVING or `timeout` passes.
absl::Status WaitForHealthy(
    const std::string& target,
    const std::shared_ptr<grpc::ChannelCredentials>& creds,
    absl::Duration timeout);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_GRPC_UTIL_GRPC_UTIL_H_
