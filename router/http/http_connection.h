// One client connection of http::Server (router/http/http_server.h): reads
// HTTP/1.1 requests, hands each to the server's handler and writes its
// response (whole, or chunked as it comes) under the idle and request
// timeouts and the pending-write cap. Internal to the server. Each
// connection runs on its own strand; ConnectionControl's methods may be
// called from any thread.
#ifndef PDSERVE_ROUTER_HTTP_HTTP_CONNECTION_H_
#define PDSERVE_ROUTER_HTTP_HTTP_CONNECTION_H_

#include <atomic>
#include <list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/ip/tcp.hpp"
#include "router/http/http_server.h"

namespace pdserve::http::internal {

// What the server asks of a live connection.
class ConnectionControl {
 public:
  virtual ~ConnectionControl() = default;
  virtual void Begin() = 0;        // start reading requests
  virtual void CloseIfIdle() = 0;  // draining: close unless a request runs
  virtual void CloseNow() = 0;
};

// Registry and shared state of the server (connections hold a pointer to it;
// the server outlives them: Stop joins the threads after closing them).
struct ServerState {
  ServerOptions options;
  Handler handler;
  std::atomic<bool> draining{false};
  std::atomic<int> active_requests{0};
  std::atomic<size_t> connections{0};  // open sockets
  absl::Mutex mu;
  std::list<std::weak_ptr<ConnectionControl>> registry ABSL_GUARDED_BY(mu);
};

// A connection for an accepted socket (which the server has counted in
// server->connections; the connection's destruction counts it out). It
// keeps itself alive from Begin() until it closes.
std::shared_ptr<ConnectionControl> NewConnection(
    boost::asio::ip::tcp::socket socket, ServerState* server);

}  // namespace pdserve::http::internal

#endif  // PDSERVE_ROUTER_HTTP_HTTP_CONNECTION_H_
