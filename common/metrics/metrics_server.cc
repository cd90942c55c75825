#include "common/metrics/metrics_server.h"

#include <exception>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace pdserve::metrics {

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
