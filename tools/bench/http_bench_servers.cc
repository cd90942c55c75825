#include "tools/bench/http_bench_servers.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "httplib.h"

namespace pdserve::http_bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

// Event i as an SSE frame of exactly 100 bytes (an OpenAI-like chunk).
std::string Event(int i) {
  char buf[128];
  int n = std::snprintf(buf, sizeof(buf),
                        "data: {\"id\":\"bench\",\"index\":%d,\"choices\":"
                        "[{\"delta\":{\"content\":\" token\"}}],\"p\":\"",
                        i);
  std::string e(buf, n);
  e.append(100 - 4 - e.size(), 'x');
  return e + "\"}\n\n";
}

Clock::time_point Due(Clock::time_point start, const Workload& w, int i) {
  return start + i * w.interval;
}

// Tells the parent which port the child's server listens on.
void ReportPort(int fd, int port) {
  if (fd < 0) {
    std::printf("listening on 127.0.0.1:%d\n", port);
    std::fflush(stdout);
    return;
  }
  if (write(fd, &port, sizeof(port)) != sizeof(port)) _exit(3);
  close(fd);
}

// ---- (1) Boost.Beast: a few threads run every connection's async chain ----

// One streaming response: read the request, write the header, then one chunk
// per timer expiry. Its handlers run one at a time (a strand per connection).
class BeastStream : public std::enable_shared_from_this<BeastStream> {
 public:
  BeastStream(tcp::socket socket, const Workload& w)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), w_(w) {}

  void Start() {
    beast::http::async_read(
        socket_, buffer_, request_,
        [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return;
          self->start_ = Clock::now();
          self->out_ =
              "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
              "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
          self->Write();
        });
  }

 private:
  void Write() {
    net::async_write(socket_, net::buffer(out_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->Next();
                     });
  }
  void Next() {
    if (sent_ == w_.events) {
      beast::error_code ec;
      socket_.shutdown(tcp::socket::shutdown_send, ec);
      return;
    }
    timer_.expires_at(Due(start_, w_, sent_));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      std::string e = Event(self->sent_++);
      std::ostringstream os;
      os << std::hex << e.size() << "\r\n" << e << "\r\n";
      if (self->sent_ == self->w_.events) os << "0\r\n\r\n";
      self->out_ = os.str();
      self->Write();
    });
  }

  tcp::socket socket_;
  net::steady_timer timer_;
  const Workload& w_;
  beast::flat_buffer buffer_;
  beast::http::request<beast::http::string_body> request_;
  Clock::time_point start_;
  std::string out_;
  int sent_ = 0;
};

void Accept(tcp::acceptor& acceptor, net::io_context& ioc, const Workload& w) {
  acceptor.async_accept(
      net::make_strand(ioc), [&](beast::error_code ec, tcp::socket socket) {
        if (!ec) std::make_shared<BeastStream>(std::move(socket), w)->Start();
        Accept(acceptor, ioc, w);
      });
}

[[noreturn]] void ServeBeast(int port_fd, const Workload& w) {
  net::io_context ioc(w.threads);
  tcp::acceptor acceptor(ioc, {net::ip::make_address("127.0.0.1"), 0});
  ReportPort(port_fd, acceptor.local_endpoint().port());
  Accept(acceptor, ioc, w);
  std::vector<std::thread> threads;
  for (int i = 1; i < w.threads; ++i) threads.emplace_back([&] { ioc.run(); });
  ioc.run();
  _exit(0);
}

// ---- (2) libmicrohttpd: epoll thread(s) + suspend/resume per event ----------

// Resumes suspended MHD connections when their next event is due (MHD has no
// timers; in a server the token source would resume them). Thread-safe.
class MhdTicker {
 public:
  MhdTicker() : thread_([this] { Run(); }) {}
  void ResumeAt(Clock::time_point due, MHD_Connection* c) {
    std::lock_guard<std::mutex> lock(mu_);
    heap_.push({due, c});
    cv_.notify_one();
  }

 private:
  using Item = std::pair<Clock::time_point, MHD_Connection*>;
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (heap_.empty()) {
        cv_.wait(lock);
      } else if (heap_.top().first > Clock::now()) {
        cv_.wait_until(lock, heap_.top().first);
      } else {
        MHD_Connection* c = heap_.top().second;
        heap_.pop();
        lock.unlock();  // MHD takes its own locks
        MHD_resume_connection(c);
        lock.lock();
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap_;
  std::thread thread_;  // never joined: the process is killed
};

struct MhdStream {
  MHD_Connection* connection;
  Clock::time_point start;
  int sent = 0;
};
const Workload* mhd_workload = nullptr;
MhdTicker* mhd_ticker = nullptr;

ssize_t MhdRead(void* cls, uint64_t, char* buf, size_t max) {
  auto* s = static_cast<MhdStream*>(cls);
  if (s->sent == mhd_workload->events) return MHD_CONTENT_READER_END_OF_STREAM;
  const Clock::time_point due = Due(s->start, *mhd_workload, s->sent);
  if (Clock::now() < due) {  // not yet: park the connection until it is due
    MHD_suspend_connection(s->connection);
    mhd_ticker->ResumeAt(due, s->connection);
    return 0;
  }
  const std::string e = Event(s->sent++);
  if (e.size() > max) return MHD_CONTENT_READER_END_WITH_ERROR;
  std::memcpy(buf, e.data(), e.size());
  return static_cast<ssize_t>(e.size());
}

MHD_Result MhdAccess(void*, MHD_Connection* connection, const char*,
                     const char*, const char*, const char*, size_t*, void**) {
  auto* s = new MhdStream{connection, Clock::now()};
  MHD_Response* r = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 4096, &MhdRead, s,
      [](void* p) { delete static_cast<MhdStream*>(p); });
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  const MHD_Result ret = MHD_queue_response(connection, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

[[noreturn]] void ServeMhd(int port_fd, const Workload& w) {
  mhd_workload = &w;
  mhd_ticker = new MhdTicker;
  MHD_Daemon* d = MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
          MHD_USE_ERROR_LOG,
      0, nullptr, nullptr, &MhdAccess, nullptr, MHD_OPTION_THREAD_POOL_SIZE,
      static_cast<unsigned>(w.threads), MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned>(20000), MHD_OPTION_END);
  if (d == nullptr) _exit(2);
  ReportPort(port_fd, MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  for (;;) pause();
}

// ---- (3) cpp-httplib: a thread pool; a stream holds its thread --------------

[[noreturn]] void ServeHttplib(int port_fd, const Workload& w, int pool,
                               bool raise_backlog) {
  httplib::Server server;
  // pool 0: the default, max(8, cores - 1) threads.
  if (pool > 0) {
    server.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  }
  server.Get("/stream", [&w](const httplib::Request&, httplib::Response& res) {
    auto sent = std::make_shared<int>(0);
    const Clock::time_point start = Clock::now();
    res.set_chunked_content_provider(
        "text/event-stream",
        [&w, sent, start](size_t, httplib::DataSink& sink) {
          if (*sent == w.events) {
            sink.done();
            return true;
          }
          std::this_thread::sleep_until(Due(start, w, *sent));
          const std::string e = Event((*sent)++);
          return sink.write(e.data(), e.size());
        });
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  if (port <= 0) _exit(2);
  // Debian's libcpp-httplib.so listens with CPPHTTPLIB_LISTEN_BACKLOG = 5, a
  // constant fixed when it was built; listen() again on its socket raises it.
  for (int fd = 0; raise_backlog && fd < 64; ++fd) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
        addr.sin_family == AF_INET && ntohs(addr.sin_port) == port) {
      listen(fd, SOMAXCONN);
    }
  }
  ReportPort(port_fd, port);
  server.listen_after_bind();
  _exit(0);
}

}  // namespace

[[noreturn]] void Serve(const std::string& lib, int port_fd, const Workload& w,
                        int n) {
  if (lib == "beast") ServeBeast(port_fd, w);
  if (lib == "mhd") ServeMhd(port_fd, w);
  // As shipped; with a listen backlog of SOMAXCONN; and also N threads.
  if (lib == "httplib") ServeHttplib(port_fd, w, 0, false);
  if (lib == "httplib_backlog") ServeHttplib(port_fd, w, 0, true);
  if (lib == "httplib_tuned") ServeHttplib(port_fd, w, n, true);
  std::fprintf(stderr, "unknown library %s\n", lib.c_str());
  _exit(2);
}

}  // namespace pdserve::http_bench
