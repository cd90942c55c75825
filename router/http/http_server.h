// A small asynchronous HTTP/1.1 server (Boost.Beast over Asio): a few
// threads serve every connection, so thousands of concurrent streaming
// responses need no thread each (see DESIGN.md for why Beast). It reads one
// request at a time per connection with limits (header bytes, body bytes) and
// timeouts (keep-alive idle, request read: a slow-loris client is cut off
// without holding a thread), hands it to a Handler, and writes the answer as
// one response or as a chunked stream (server-sent events). While a response
// is pending it watches the socket, so a client that closes its connection is
// noticed at once (Responder::SetOnClientGone). Draining stops accepting,
// closes idle connections and lets responses in progress finish.
// Thread-safe.
#ifndef PDSERVE_ROUTER_HTTP_HTTP_SERVER_H_
#define PDSERVE_ROUTER_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query
  std::string query;   // after '?', undecoded
  Headers headers;
  std::string body;
  // The first header of that name (case-insensitive), or "".
  std::string Header(std::string_view name) const;
};

// The answering side of one request. Every method may be called from any
// thread; each posts its work to the connection. Either Send once, or
// StartStream, then any number of SendChunk, then EndStream.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void Send(int status, std::string content_type, std::string body,
                    Headers extra = {}) = 0;
  // Chunked transfer encoding: the header goes now, each chunk as it comes.
  virtual void StartStream(int status, std::string content_type,
                           Headers extra = {}) = 0;
  // False once the client is gone (nothing more will be written).
  virtual bool SendChunk(std::string data) = 0;
  virtual void EndStream() = 0;
  // `on_gone` runs once, on some thread, if the client disconnects (or
  // stops reading) before the response is complete; at once if it already
  // has.
  virtual void SetOnClientGone(std::function<void()> on_gone) = 0;
  virtual bool client_gone() const = 0;
};

using Handler =
    std::function<void(Request request, std::shared_ptr<Responder> responder)>;

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;  // 0: any free port (see Server::port)
  int threads = 2;
  size_t max_header_bytes = 64 << 10;  // beyond: 431
  size_t max_body_bytes = 8 << 20;     // beyond: 413
  // A connection with no request in progress is closed after this.
  absl::Duration idle_timeout = absl::Seconds(60);
  // From a request's first byte to its last (header and body).
  absl::Duration request_timeout = absl::Seconds(30);
  // Bytes queued for a client that does not read them; beyond, it counts as
  // gone (its request is cancelled).
  size_t max_pending_write_bytes = 16 << 20;
  size_t max_connections = 20000;  // beyond: new connections are closed
};

class Server {
 public:
  // Binds exclusively (a taken port fails with "address already in use")
  // and starts serving. The handler runs on the server's threads: it must
  // not block (answer later through the Responder).
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const ServerOptions& options, Handler handler);
  ~Server();  // Stop()

  int port() const;
  // Stops accepting; idle connections close; new requests on open ones get
  // 503 with Connection: close; responses in progress continue.
  void StartDraining();
  // Requests whose response is not complete yet.
  int active_requests() const;
  // Closes every connection and joins the threads.
  void Stop();

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reason phrase of a status code ("Not Found").
std::string_view StatusReason(int status);

}  // namespace pdserve::http

#endif  // PDSERVE_ROUTER_HTTP_HTTP_SERVER_H_
