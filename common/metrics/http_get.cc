#include "common/metrics/http_get.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pdserve::metrics {
namespace {

// Closes the socket on scope exit.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Waits for `events` on fd until `deadline`.
absl::Status WaitFor(int fd, short events, absl::Time deadline) {
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("HTTP GET timed out");
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(ms));
    if (r > 0) return absl::OkStatus();
    if (r < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
}

absl::StatusOr<int> Connect(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolve ", host, ": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    last_error = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(result);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("connect ", host, ":", port, ": ", last_error));
  }
  return fd;
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(absl::string_view host, int port,
                                     absl::string_view path,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto fd_or = Connect(std::string(host), port);
  if (!fd_or.ok()) return fd_or.status();
  ScopedFd fd(*fd_or);

  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, ":", port,
                   "\r\nConnection: close\r\nAccept: text/plain\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    absl::Status ready = WaitFor(fd.get(), POLLOUT, deadline);
    if (!ready.ok()) return ready;
    const ssize_t n = send(fd.get(), request.data() + sent,
                           request.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("send: ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }

  std::string raw;
  char buf[16384];
  while (true) {
    absl::Status ready = WaitFor(fd.get(), POLLIN, deadline);
    if (!ready.ok()) return ready;
    const ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("recv: ", std::strerror(errno)));
    }
    raw.append(buf, static_cast<size_t>(n));
  }

  const size_t header_end = raw.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::InternalError("HTTP response without a header block");
  }
  // Status line: HTTP/1.x NNN reason
  const absl::string_view status_line =
      absl::string_view(raw).substr(0, raw.find("\r\n"));
  std::vector<absl::string_view> parts =
      absl::StrSplit(status_line, absl::MaxSplits(' ', 2));
  HttpResponse response;
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/") ||
      !absl::SimpleAtoi(parts[1], &response.status)) {
    return absl::InternalError(
        absl::StrCat("bad HTTP status line: ", status_line));
  }
  response.body = raw.substr(header_end + 4);
  return response;
}

}  // namespace pdserve::metrics
