// Small networking helpers: free loopback ports (tests, `pdserve up`) and
// host:port parsing. Thread-safe (no shared state).
#ifndef PDSERVE_COMMON_UTIL_NET_H_
#define PDSERVE_COMMON_UTIL_NET_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve {

// A TCP port that was free on 127.0.0.1 when checked (bind to port 0). The
// port can be taken by someone else before it is used: prefer servers that
// bind port 0 and report their port where possible.
absl::StatusOr<int> PickFreePort();

struct HostPort {
  std::string host;
  int port = 0;
};
// "host:port" or "[v6]:port".
absl::StatusOr<HostPort> ParseHostPort(absl::string_view s);

// Resolves a host name to its IPv4/IPv6 addresses (getaddrinfo), as strings
// suitable for "addr:port" gRPC targets ("[v6]:port" is formatted by
// JoinHostPort).
absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host);
std::string JoinHostPort(absl::string_view host, int port);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_NET_H_
