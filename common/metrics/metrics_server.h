// MetricsServer: one process's Prometheus registry, served over HTTP at
// /metrics by prometheus-cpp's pull exposer (civetweb). Port 0 disables the
// listener (the registry still works, so metric bundles can always be built).
// Thread-safe: the registry and its metrics are; Start/destruction are not
// concurrent with each other.
#ifndef PDSERVE_COMMON_METRICS_METRICS_SERVER_H_
#define PDSERVE_COMMON_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace pdserve::metrics {

// Asks the kernel for any free port (tests). 0 means "disabled", as the
// --metrics_port flag documents.
inline constexpr int kAnyFreePort = -1;

struct MetricsServerOptions {
  int port = 0;                          // 0: disabled; kAnyFreePort: ephemeral
  std::string bind_address = "0.0.0.0";  // "127.0.0.1" for loopback only
  int num_threads = 2;
};

class MetricsServer {
 public:
  // Binds and starts serving (unless disabled). Fails with UNAVAILABLE when
  // the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options);
  ~MetricsServer();

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  prometheus::Registry& registry() { return *registry_; }
  bool serving() const { return exposer_ != nullptr; }
  // The bound port (the real one for kAnyFreePort); 0 when disabled.
  int port() const { return port_; }

 private:
  MetricsServer() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_METRICS_SERVER_H_
