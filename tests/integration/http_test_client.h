// A minimal blocking HTTP/1.1 client over a raw loopback socket, for the HTTP
// API tests: it sends exactly the bytes a test gives (so malformed requests
// can be sent too), reads the raw answer and decodes it (status, headers,
// chunked body). Not thread-safe: one per thread.
#ifndef PDSERVE_TESTS_INTEGRATION_HTTP_TEST_CLIENT_H_
#define PDSERVE_TESTS_INTEGRATION_HTTP_TEST_CLIENT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve::testing {

struct HttpReply {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;                                   // de-chunked
  std::string raw;                                    // every byte received
  std::string Header(const std::string& name) const;  // case-insensitive
};

class RawHttpConnection {
 public:
  static absl::StatusOr<RawHttpConnection> Connect(int port);
  RawHttpConnection(RawHttpConnection&& other) noexcept;
  RawHttpConnection& operator=(RawHttpConnection&& other) noexcept;
  ~RawHttpConnection();

  absl::Status SendBytes(const std::string& bytes);
  // Reads one whole response (Content-Length or chunked, or to EOF). The
  // reply to a HEAD request (`to_head`) is its header alone, whatever its
  // Content-Length says.
  absl::StatusOr<HttpReply> ReadReply(absl::Duration timeout,
                                      bool to_head = false);
  // Reads whatever arrives within `timeout` (at most `max` bytes); "" at EOF.
  absl::StatusOr<std::string> ReadSome(size_t max, absl::Duration timeout);
  // True when the server closed the connection (EOF) within `timeout`.
  bool WaitForClose(absl::Duration timeout);
  void Close();
  // Sends `bytes` and ends the sending side in the same segment (TCP FIN),
  // then keeps reading: a half-close.
  absl::Status SendBytesAndShutdownWrite(const std::string& bytes);

 private:
  explicit RawHttpConnection(int fd) : fd_(fd) {}
  int fd_ = -1;
  std::string pending_;  // bytes read past the previous reply
};

// One request on a new connection (Connection: close).
absl::StatusOr<HttpReply> HttpRequest(
    int port, const std::string& method, const std::string& path,
    const std::string& body = "", absl::Duration timeout = absl::Seconds(60));

// Parses a server-sent-events body: the payload of every "data: " event.
// INVALID_ARGUMENT unless the body is exactly "data: X\n\n" events.
absl::StatusOr<std::vector<std::string>> ParseSseEvents(
    const std::string& body);

}  // namespace pdserve::testing

#endif  // PDSERVE_TESTS_INTEGRATION_HTTP_TEST_CLIENT_H_
