// The HTTP server (router/http/http_server) at the open-file limit: a server
// that cannot accept (EMFILE) must neither spin a core nor stop serving once
// descriptors are free again, and one whose limit is below its connection
// cap closes the surplus connections instead of leaving them unaccepted.
// And a client that half-closes after its request: an answer still reaches
// it, unless the handler watches for the client leaving (a generation).
#include "router/http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace pdserve::http {
namespace {

// Restores the soft open-file limit at scope exit.
class ScopedFileLimit {
 public:
  explicit ScopedFileLimit(rlim_t soft) {
    getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = soft;
    ok_ = setrlimit(RLIMIT_NOFILE, &lowered) == 0;
  }
  ~ScopedFileLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
};

// Connects `fd` (a fresh TCP socket) to the loopback port; closes it and
// returns -1 on failure.
int Connect(int fd, int port) {
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

int ConnectTo(int port) {
  return Connect(socket(AF_INET, SOCK_STREAM, 0), port);
}

// Sends a GET and returns what comes back until the server closes or the
// receive times out ("" when nothing came).
std::string Get(int fd) {
  const std::string request =
      "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) return "";
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  return response;
}

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

std::unique_ptr<Server> StartPingServer() {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  auto server =
      Server::Start(options, [](Request, std::shared_ptr<Responder> responder) {
        responder->Send(200, "text/plain", "pong");
      });
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(HttpServerTest, OutOfDescriptorsNeitherSpinsNorStopsServing) {
  auto server = StartPingServer();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  // Take every descriptor but two under a low limit, make two sockets with
  // them (before connecting either, so the server cannot take one of the
  // two by accepting the first connection), then connect both: the kernel
  // completes both handshakes, the server cannot accept them.
  ScopedFileLimit limit(256);
  ASSERT_TRUE(limit.ok());
  std::vector<int> filler;
  for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0;) filler.push_back(fd);
  ASSERT_GE(filler.size(), 2u);
  close(filler.back());
  filler.pop_back();
  close(filler.back());
  filler.pop_back();
  const int first_socket = socket(AF_INET, SOCK_STREAM, 0);
  const int second_socket = socket(AF_INET, SOCK_STREAM, 0);
  const int first = Connect(first_socket, port);
  const int second = Connect(second_socket, port);
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  // A server that retried accept at once would burn a core for this second
  // (the test thread only sleeps).
  const double cpu_before = ProcessCpuSeconds();
  absl::SleepFor(absl::Seconds(1));
  const double cpu_spent = ProcessCpuSeconds() - cpu_before;
  EXPECT_LT(cpu_spent, 0.5) << "the server spins while it cannot accept";
  for (int fd : filler) close(fd);
  // With descriptors free again both connections are served.
  EXPECT_NE(Get(first).find("pong"), std::string::npos);
  EXPECT_NE(Get(second).find("pong"), std::string::npos);
  close(first);
  close(second);
}

TEST(HttpServerTest, ConnectionsBeyondTheLimitAreClosedNotLeftWaiting) {
  // The cap is taken from the limit when the server starts.
  std::unique_ptr<Server> server;
  {
    ScopedFileLimit limit(256 + 4);
    ASSERT_TRUE(limit.ok());
    server = StartPingServer();
  }
  ASSERT_NE(server, nullptr);
  std::vector<int> clients;
  for (int i = 0; i < 40; ++i) {
    const int fd = ConnectTo(server->port());
    ASSERT_GE(fd, 0);
    clients.push_back(fd);
  }
  // Every client gets an answer: a response, or the connection closed
  // (read returns 0 or a reset), never a wait until the receive timeout.
  int served = 0;
  for (int fd : clients) {
    const absl::Time start = absl::Now();
    const std::string response = Get(fd);
    if (response.find("pong") != std::string::npos) ++served;
    EXPECT_LT(absl::Now() - start, absl::Seconds(9))
        << "a connection beyond the cap was left unanswered";
    close(fd);
  }
  EXPECT_GE(served, 1);
  EXPECT_LT(served, 40);
}

// Sends `request`, shuts the write side (as `printf ... | nc -N` does) and
// returns what comes back until the server closes or the receive times out.
std::string SendHalfClosedAndRead(int fd, const std::string& request) {
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) return "";
  shutdown(fd, SHUT_WR);
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  return response;
}

TEST(HttpServerTest, HalfClosedClientsGetLateAnswersUnlessTheHandlerWatches) {
  // GET answers 200 ms late (on another thread), so the client's EOF always
  // reaches the server first. POST registers a client-gone callback and
  // never answers, as a generation whose client left would.
  std::atomic<int> gone_calls{0};
  std::vector<std::thread> answerers;
  absl::Mutex mu;
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  auto server = Server::Start(
      options, [&](Request request, std::shared_ptr<Responder> responder) {
        if (request.method == "POST") {
          responder->SetOnClientGone([&] { gone_calls.fetch_add(1); });
          return;
        }
        absl::MutexLock lock(&mu);
        answerers.emplace_back([responder] {
          absl::SleepFor(absl::Milliseconds(200));
          responder->Send(200, "text/plain", "late pong");
        });
      });
  ASSERT_TRUE(server.ok()) << server.status();
  for (int i = 0; i < 3; ++i) {
    const int fd = ConnectTo((*server)->port());
    ASSERT_GE(fd, 0);
    const std::string response =
        SendHalfClosedAndRead(fd, "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n");
    close(fd);
    EXPECT_NE(response.find("200 OK"), std::string::npos) << response;
    EXPECT_NE(response.find("late pong"), std::string::npos) << response;
  }
  const int fd = ConnectTo((*server)->port());
  ASSERT_GE(fd, 0);
  const absl::Time start = absl::Now();
  const std::string response = SendHalfClosedAndRead(
      fd, "POST /gen HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  close(fd);
  EXPECT_EQ(response, "") << "a watched request is abandoned on EOF";
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "closed, not timed out";
  for (int waited = 0; gone_calls.load() == 0 && waited < 100; ++waited) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(gone_calls.load(), 1);
  absl::MutexLock lock(&mu);
  for (std::thread& t : answerers) t.join();
}

}  // namespace
}  // namespace pdserve::http
