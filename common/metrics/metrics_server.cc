#include "common/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace pdserve::metrics {
namespace {

// OK when a listening socket could bind host:port right now.
absl::Status CheckPortFree(const std::string& host, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::OkStatus();  // let the exposer try and report
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return absl::OkStatus();  // not an IPv4 literal: the exposer decides
  }
  absl::Status status = absl::OkStatus();
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    status = absl::UnavailableError(errno == EADDRINUSE
                                        ? "address already in use"
                                        : std::string(strerror(errno)));
  }
  close(fd);
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options) {
  if (options.port < kAnyFreePort || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port out of range: ", options.port));
  }
  auto server = absl::WrapUnique(new MetricsServer());
  server->registry_ = std::make_shared<prometheus::Registry>();
  if (options.port == 0) return server;

  const int port = options.port == kAnyFreePort ? 0 : options.port;
  const std::string address = absl::StrCat(options.bind_address, ":", port);
  // civetweb reports a taken port only as "null context": bind it ourselves
  // first to say what is wrong.
  if (port > 0) {
    if (absl::Status free = CheckPortFree(options.bind_address, port);
        !free.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on ", address, ": ",
                       free.message(), " (pick another --metrics_port)"));
    }
  }
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(
        address, static_cast<size_t>(options.num_threads));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  server->exposer_->RegisterCollectable(server->registry_);
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::InternalError(
        absl::StrCat("metrics exposer on ", address, " reports no port"));
  }
  server->port_ = ports[0];
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace pdserve::metrics
