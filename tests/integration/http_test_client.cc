#include "tests/integration/http_test_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace pdserve::testing {

std::string HttpReply::Header(const std::string& name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) return v;
  }
  return "";
}

absl::StatusOr<RawHttpConnection> RawHttpConnection::Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string err = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect: ", err));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return RawHttpConnection(fd);
}

RawHttpConnection::RawHttpConnection(RawHttpConnection&& other) noexcept
    : fd_(other.fd_), pending_(std::move(other.pending_)) {
  other.fd_ = -1;
}

RawHttpConnection& RawHttpConnection::operator=(
    RawHttpConnection&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.fd_;
    pending_ = std::move(other.pending_);
    other.fd_ = -1;
  }
  return *this;
}

RawHttpConnection::~RawHttpConnection() { Close(); }

void RawHttpConnection::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status RawHttpConnection::SendBytesAndShutdownWrite(
    const std::string& bytes) {
  // Corked, the bytes and the FIN leave in one segment: the server finds
  // the end of the stream already there when it reads the request.
  const int on = 1;
  if (setsockopt(fd_, IPPROTO_TCP, TCP_CORK, &on, sizeof(on)) != 0) {
    return absl::InternalError(absl::StrCat("TCP_CORK: ", strerror(errno)));
  }
  absl::Status sent = SendBytes(bytes);
  shutdown(fd_, SHUT_WR);
  return sent;
}

absl::Status RawHttpConnection::SendBytes(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n =
        send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RawHttpConnection::ReadSome(
    size_t max, absl::Duration timeout) {
  if (!pending_.empty()) {
    std::string out = pending_.substr(0, max);
    pending_.erase(0, out.size());
    return out;
  }
  pollfd p{fd_, POLLIN, 0};
  const int r =
      poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (r == 0) return absl::DeadlineExceededError("no bytes in time");
  if (r < 0) return absl::InternalError(strerror(errno));
  std::string buf(max, '\0');
  const ssize_t n = recv(fd_, buf.data(), max, 0);
  if (n < 0)
    return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
  buf.resize(static_cast<size_t>(n));
  return buf;
}

bool RawHttpConnection::WaitForClose(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto got = ReadSome(65536, deadline - absl::Now());
    if (!got.ok()) return absl::IsUnavailable(got.status());  // reset
    if (got->empty()) return true;                            // EOF
  }
  return false;
}

absl::StatusOr<HttpReply> RawHttpConnection::ReadReply(absl::Duration timeout,
                                                       bool to_head) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string data = std::move(pending_);
  pending_.clear();
  bool eof = false;
  auto fill = [&]() -> absl::Status {
    if (eof) return absl::DataLossError("connection closed early");
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("reply");
    auto got = ReadSome(65536, deadline - absl::Now());
    if (!got.ok()) return got.status();
    if (got->empty()) eof = true;
    data += *got;
    return absl::OkStatus();
  };
  size_t header_end;
  while ((header_end = data.find("\r\n\r\n")) == std::string::npos) {
    if (auto s = fill(); !s.ok()) return s;
  }
  HttpReply reply;
  std::vector<std::string> lines =
      absl::StrSplit(data.substr(0, header_end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 ||
      !absl::SimpleAtoi(status_line[1], &reply.status)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad status line: ", lines[0]));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    reply.headers.emplace_back(
        lines[i].substr(0, colon),
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1))));
  }
  size_t pos = header_end + 4;
  if (to_head) {
    // No body.
  } else if (absl::EqualsIgnoreCase(reply.Header("Transfer-Encoding"),
                                    "chunked")) {
    while (true) {
      size_t line_end;
      while ((line_end = data.find("\r\n", pos)) == std::string::npos) {
        if (auto s = fill(); !s.ok()) return s;
      }
      size_t size = 0;
      if (!absl::SimpleHexAtoi(data.substr(pos, line_end - pos), &size)) {
        return absl::InvalidArgumentError("bad chunk size");
      }
      while (data.size() < line_end + 2 + size + 2) {
        if (auto s = fill(); !s.ok()) return s;
      }
      reply.body += data.substr(line_end + 2, size);
      if (data.substr(line_end + 2 + size, 2) != "\r\n") {
        return absl::InvalidArgumentError("chunk not followed by CRLF");
      }
      pos = line_end + 2 + size + 2;
      if (size == 0) break;
    }
  } else if (!reply.Header("Content-Length").empty()) {
    size_t length = 0;
    if (!absl::SimpleAtoi(reply.Header("Content-Length"), &length)) {
      return absl::InvalidArgumentError("bad Content-Length");
    }
    while (data.size() < pos + length) {
      if (auto s = fill(); !s.ok()) return s;
    }
    reply.body = data.substr(pos, length);
    pos += length;
  } else {
    while (!eof) {
      if (auto s = fill(); !s.ok() && !eof) return s;
    }
    reply.body = data.substr(pos);
    pos = data.size();
  }
  reply.raw = data.substr(0, pos);
  pending_ = data.substr(pos);
  return reply;
}

absl::StatusOr<HttpReply> HttpRequest(int port, const std::string& method,
                                      const std::string& path,
                                      const std::string& body,
                                      absl::Duration timeout) {
  auto conn = RawHttpConnection::Connect(port);
  if (!conn.ok()) return conn.status();
  std::string req = absl::StrCat(method, " ", path,
                                 " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 "Connection: close\r\n");
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&req, "Content-Type: application/json\r\nContent-Length: ",
                    body.size(), "\r\n");
  }
  absl::StrAppend(&req, "\r\n", body);
  if (auto s = conn->SendBytes(req); !s.ok()) return s;
  return conn->ReadReply(timeout);
}

absl::StatusOr<std::vector<std::string>> ParseSseEvents(
    const std::string& body) {
  std::vector<std::string> events;
  size_t pos = 0;
  while (pos < body.size()) {
    if (body.compare(pos, 6, "data: ") != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("event at byte ", pos, " does not start with 'data: '"));
    }
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      return absl::InvalidArgumentError("event without a blank line after it");
    }
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    if (payload.find('\n') != std::string::npos) {
      return absl::InvalidArgumentError("event payload spans lines");
    }
    events.push_back(payload);
    pos = end + 2;
  }
  return events;
}

}  // namespace pdserve::testing
