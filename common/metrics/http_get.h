// A minimal blocking HTTP/1.0 GET over a TCP socket, for tests and tools that
// scrape /metrics (no HTTP client library in the dependency set). Stateless:
// thread-safe.
#ifndef PDSERVE_COMMON_METRICS_HTTP_GET_H_
#define PDSERVE_COMMON_METRICS_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pdserve::metrics {

struct HttpResponse {
  int status = 0;    // e.g. 200
  std::string body;  // bytes after the header block
};

// GET http://host:port/path. host is a name or a numeric address. Fails with
// UNAVAILABLE when it cannot connect, DEADLINE_EXCEEDED on timeout, INTERNAL
// on a malformed response. Any HTTP status is returned as a value.
absl::StatusOr<HttpResponse> HttpGet(
    absl::string_view host, int port, absl::string_view path,
    absl::Duration timeout = absl::Seconds(10));

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_HTTP_GET_H_
