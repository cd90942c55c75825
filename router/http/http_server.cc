#include "router/http/http_server.h"

#include <atomic>
#include <deque>
#include <list>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/bind_executor.hpp"
#include "boost/asio/dispatch.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http.hpp"
#include "common/util/fd_limit.h"
#include "common/util/logging.h"

namespace pdserve::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;

std::string Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k,
                               absl::string_view(name.data(), name.size()))) {
      return v;
    }
  }
  return "";
}

std::string_view StatusReason(int status) {
  const auto reason =
      bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return std::string_view(reason.data(), reason.size());
}

namespace {

class Connection;

// Registry and shared state of the server (connections hold a pointer to it;
// the server outlives them: Stop joins the threads after closing them).
struct ServerState {
  ServerOptions options;
  Handler handler;
  std::atomic<bool> draining{false};
  std::atomic<int> active_requests{0};
  std::atomic<size_t> connections{0};
  absl::Mutex mu;
  std::list<std::weak_ptr<Connection>> registry ABSL_GUARDED_BY(mu);
};

std::string SerializeHeader(int status, const std::string& content_type,
                            const Headers& extra, bool keep_alive,
                            std::optional<size_t> content_length) {
  bhttp::response<bhttp::empty_body> res{static_cast<bhttp::status>(status),
                                         11};
  res.set(bhttp::field::server, "pdserve");
  if (!content_type.empty()) res.set(bhttp::field::content_type, content_type);
  for (const auto& [k, v] : extra) res.set(k, v);
  res.keep_alive(keep_alive);
  if (content_length.has_value()) {
    res.content_length(*content_length);
  } else {
    res.chunked(true);
  }
  std::ostringstream os;
  os << res.base();
  return os.str();
}

std::string ChunkFrame(std::string_view data) {
  std::ostringstream os;
  os << std::hex << data.size() << "\r\n" << data << "\r\n";
  return os.str();
}

// One client connection. Everything but the Responder's entry points runs on
// the connection's strand. Phases: waiting for a request's first byte (idle
// timeout), reading it (request timeout), answering (a read stays pending to
// notice a disconnect), then back to waiting (keep-alive) or closing.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ServerState* server)
      : socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        server_(server) {}

  void Begin() {
    net::dispatch(socket_.get_executor(),
                  [self = shared_from_this()] { self->WaitForBytes(); });
  }
  // Draining: close now unless a request is in progress.
  void CloseIfIdle() {
    net::post(socket_.get_executor(), [self = shared_from_this()] {
      if (self->responder_ == nullptr && !self->reading_) self->Close();
    });
  }
  void CloseNow() {
    net::post(socket_.get_executor(),
              [self = shared_from_this()] { self->Close(); });
  }

  // The Responder of the request in progress.
  class ResponderImpl : public Responder,
                        public std::enable_shared_from_this<ResponderImpl> {
   public:
    explicit ResponderImpl(std::shared_ptr<Connection> conn)
        : conn_(std::move(conn)) {}

    void Send(int status, std::string content_type, std::string body,
              Headers extra) override {
      Post([status, ct = std::move(content_type), body = std::move(body),
            extra = std::move(extra)](Connection& c, ResponderImpl& r) {
        if (r.started_) return;
        r.started_ = true;
        std::string bytes =
            SerializeHeader(status, ct, extra, c.KeepAlive(), body.size());
        bytes += body;
        c.Enqueue(std::move(bytes), /*last=*/true);
      });
    }
    void StartStream(int status, std::string content_type,
                     Headers extra) override {
      Post([status, ct = std::move(content_type), extra = std::move(extra)](
               Connection& c, ResponderImpl& r) {
        if (r.started_) return;
        r.started_ = true;
        r.streaming_ = true;
        c.Enqueue(
            SerializeHeader(status, ct, extra, c.KeepAlive(), std::nullopt),
            false);
      });
    }
    bool SendChunk(std::string data) override {
      if (gone_.load()) return false;
      if (data.empty()) return true;
      Post([data = std::move(data)](Connection& c, ResponderImpl& r) {
        if (!r.streaming_ || r.ended_) return;
        c.Enqueue(ChunkFrame(data), false);
      });
      return true;
    }
    void EndStream() override {
      Post([](Connection& c, ResponderImpl& r) {
        if (!r.streaming_ || r.ended_) return;
        r.ended_ = true;
        c.Enqueue("0\r\n\r\n", /*last=*/true);
      });
    }
    void SetOnClientGone(std::function<void()> on_gone) override {
      bool call_now = false;
      {
        absl::MutexLock lock(&mu_);
        if (gone_.load()) {
          call_now = true;
        } else {
          on_gone_ = std::move(on_gone);
        }
      }
      if (call_now && on_gone) on_gone();
    }
    bool client_gone() const override { return gone_.load(); }

    // The connection closed before the response completed.
    void MarkGone() {
      std::function<void()> cb;
      {
        absl::MutexLock lock(&mu_);
        if (gone_.exchange(true)) return;
        cb = std::move(on_gone_);
      }
      if (cb) cb();
    }

   private:
    // Runs `fn` on the connection's strand if this is still its current
    // request.
    void Post(std::function<void(Connection&, ResponderImpl&)> fn) {
      net::post(conn_->socket_.get_executor(),
                [self = shared_from_this(), fn = std::move(fn)] {
                  if (self->conn_->responder_ != self) return;
                  fn(*self->conn_, *self);
                });
    }

    const std::shared_ptr<Connection> conn_;
    std::atomic<bool> gone_{false};
    absl::Mutex mu_;
    std::function<void()> on_gone_ ABSL_GUARDED_BY(mu_);
    // Strand only.
    bool started_ = false, streaming_ = false, ended_ = false;
  };

 private:
  bool KeepAlive() const { return keep_alive_ && !server_->draining.load(); }

  // Closes the socket when `after` passes, unless re-armed or disarmed.
  void ArmTimer(absl::Duration after) {
    const uint64_t generation = ++timer_generation_;
    timer_.expires_after(absl::ToChronoNanoseconds(after));
    timer_.async_wait([self = shared_from_this(), generation](ErrorCode ec) {
      if (ec || generation != self->timer_generation_) return;
      self->Close();
    });
  }
  void DisarmTimer() {
    ++timer_generation_;
    timer_.cancel();
  }

  // Waits for the next bytes: the start of a request (idle phase) or, while
  // answering, a disconnect (EOF) or pipelined bytes.
  void WaitForBytes() {
    if (closed_) return;
    if (responder_ == nullptr) {
      if (buffer_.size() > 0 && !watching_) return ReadRequest();
      if (server_->draining.load() && served_ > 0) return Close();
      ArmTimer(served_ == 0 ? server_->options.request_timeout
                            : server_->options.idle_timeout);
    }
    if (watching_) return;  // the read in flight serves this wait too
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](
                                                       ErrorCode ec, size_t n) {
      self->watching_ = false;
      if (ec) return self->Close();
      self->buffer_.commit(n);
      // Answering: the next request waits until this one is done.
      if (self->responder_ == nullptr) self->ReadRequest();
    });
  }

  void ReadRequest() {
    if (closed_) return;
    reading_ = true;
    ArmTimer(server_->options.request_timeout);
    parser_.emplace();
    parser_->header_limit(
        static_cast<std::uint32_t>(server_->options.max_header_bytes));
    parser_->body_limit(server_->options.max_body_bytes);
    bhttp::async_read_header(socket_, buffer_, *parser_,
                             [self = shared_from_this()](ErrorCode ec, size_t) {
                               self->OnHeader(ec);
                             });
  }

  void OnHeader(ErrorCode ec) {
    if (ec) return OnReadError(ec);
    const auto& req = parser_->get();
    const auto length = parser_->content_length();
    if (length.has_value() && *length > server_->options.max_body_bytes) {
      return Refuse(413, absl::StrCat("request body of ", *length,
                                      " bytes is over the limit of ",
                                      server_->options.max_body_bytes));
    }
    if (absl::EqualsIgnoreCase(std::string(req[bhttp::field::expect]),
                               "100-continue")) {
      auto cont =
          std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(socket_, net::buffer(*cont),
                       [self = shared_from_this(), cont](ErrorCode ec, size_t) {
                         if (ec) return self->Close();
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    bhttp::async_read(socket_, buffer_, *parser_,
                      [self = shared_from_this()](ErrorCode ec, size_t) {
                        self->OnRequest(ec);
                      });
  }

  void OnReadError(ErrorCode ec) {
    if (ec == bhttp::error::header_limit) {
      return Refuse(431,
                    absl::StrCat("request header over the limit of ",
                                 server_->options.max_header_bytes, " bytes"));
    }
    if (ec == bhttp::error::body_limit) {
      return Refuse(413,
                    absl::StrCat("request body over the limit of ",
                                 server_->options.max_body_bytes, " bytes"));
    }
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::operation_aborted || closed_) {
      return Close();
    }
    Refuse(400, absl::StrCat("malformed HTTP request: ", ec.message()));
  }

  // An error answer, then close (the rest of the request is not read).
  void Refuse(int status, const std::string& message) {
    reading_ = false;
    keep_alive_ = false;
    std::string body = absl::StrCat(
        R"({"error":{"message":")", message,
        R"(","type":"invalid_request_error","param":null,"code":null}})");
    std::string bytes =
        SerializeHeader(status, "application/json", {}, false, body.size());
    bytes += body;
    close_after_write_ = true;
    Enqueue(std::move(bytes), /*last=*/false);
  }

  void OnRequest(ErrorCode ec) {
    if (ec) return OnReadError(ec);
    reading_ = false;
    DisarmTimer();
    auto message = parser_->release();
    parser_.reset();
    Request request;
    request.method = std::string(message.method_string());
    const std::string target(message.target());
    const size_t q = target.find('?');
    request.path = target.substr(0, q);
    if (q != std::string::npos) request.query = target.substr(q + 1);
    for (const auto& field : message) {
      request.headers.emplace_back(std::string(field.name_string()),
                                   std::string(field.value()));
    }
    request.body = std::move(message.body());
    keep_alive_ = message.keep_alive();
    ++served_;
    if (server_->draining.load()) {
      keep_alive_ = false;
      std::string body =
          R"({"error":{"message":"server is draining","type":"server_error","param":null,"code":null}})";
      std::string bytes =
          SerializeHeader(503, "application/json", {}, false, body.size());
      bytes += body;
      close_after_write_ = true;
      return Enqueue(std::move(bytes), false);
    }
    responder_ = std::make_shared<ResponderImpl>(shared_from_this());
    server_->active_requests.fetch_add(1);
    WaitForBytes();  // notice a disconnect while answering
    server_->handler(std::move(request), responder_);
  }

  void Enqueue(std::string bytes, bool last) {
    if (closed_) return;
    queued_bytes_ += bytes.size();
    if (queued_bytes_ > server_->options.max_pending_write_bytes) {
      return Close();  // the client does not read what it asked for
    }
    out_.push_back(std::move(bytes));
    if (last) response_complete_ = true;
    if (!writing_) DoWrite();
  }

  void DoWrite() {
    if (closed_) return;
    if (out_.empty()) {
      writing_ = false;
      if (close_after_write_) return Close();
      if (response_complete_) OnResponseComplete();
      return;
    }
    writing_ = true;
    write_buf_.clear();
    for (std::string& s : out_) write_buf_ += s;
    out_.clear();
    net::async_write(socket_, net::buffer(write_buf_),
                     [self = shared_from_this()](ErrorCode ec, size_t n) {
                       if (ec) return self->Close();
                       self->queued_bytes_ -= n;
                       self->DoWrite();
                     });
  }

  void OnResponseComplete() {
    response_complete_ = false;
    if (responder_ != nullptr) {
      responder_.reset();
      server_->active_requests.fetch_sub(1);
    }
    if (!KeepAlive()) return Close();
    WaitForBytes();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    DisarmTimer();
    ErrorCode ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    if (responder_ != nullptr) {
      std::shared_ptr<ResponderImpl> r = std::move(responder_);
      server_->active_requests.fetch_sub(1);
      r->MarkGone();
    }
  }

 public:
  ~Connection() { server_->connections.fetch_sub(1); }

 private:
  tcp::socket socket_;
  net::steady_timer timer_;
  ServerState* const server_;
  boost::beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<ResponderImpl> responder_;
  std::deque<std::string> out_;
  std::string write_buf_;
  size_t queued_bytes_ = 0;  // queued or being written
  uint64_t timer_generation_ = 0;
  int served_ = 0;
  bool keep_alive_ = true;
  bool reading_ = false;
  bool watching_ = false;
  bool writing_ = false;
  bool response_complete_ = false;
  bool close_after_write_ = false;
  bool closed_ = false;
};

}  // namespace

class Server::Impl {
 public:
  Impl(const ServerOptions& options, Handler handler)
      : ioc_(std::max(1, options.threads)), acceptor_(ioc_) {
    state_.options = options;
    state_.handler = std::move(handler);
  }

  absl::Status Listen() {
    ErrorCode ec;
    const auto address = net::ip::make_address(state_.options.host, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad HTTP host '", state_.options.host, "': ", ec.message()));
    }
    const tcp::endpoint endpoint(address,
                                 static_cast<uint16_t>(state_.options.port));
    acceptor_.open(endpoint.protocol(), ec);
    // SO_REUSEADDR only (restart while old connections linger); never
    // SO_REUSEPORT: a second server on the port must fail, not share it.
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on HTTP ", state_.options.host, ":",
          state_.options.port, ": ", ec.message(),
          ec == net::error::address_in_use
              ? " (another process has this port: pick another --http_port)"
              : ""));
    }
    port_ = acceptor_.local_endpoint().port();
    // Leave descriptors for gRPC channels, files and the connections the
    // router opens itself: beyond, new connections are closed at once
    // instead of failing to be accepted (and waiting in the backlog).
    const int64_t fd_limit = OpenFileLimit();
    max_connections_ = state_.options.max_connections;
    if (fd_limit - kReservedDescriptors <
        static_cast<int64_t>(max_connections_)) {
      max_connections_ = static_cast<size_t>(
          std::max<int64_t>(16, fd_limit - kReservedDescriptors));
      PDSERVE_LOG_INFO(
          "HTTP: at most %zu connections: the open-file limit is %lld "
          "(raise `ulimit -n` for more)",
          max_connections_, static_cast<long long>(fd_limit));
    }
    Accept();
    for (int i = 0; i < std::max(1, state_.options.threads); ++i) {
      threads_.emplace_back([this] { ioc_.run(); });
    }
    return absl::OkStatus();
  }

  void Accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](ErrorCode ec,
                                                          tcp::socket socket) {
      if (ec) {
        if (ec == net::error::operation_aborted) return;  // closed
        // Out of descriptors (EMFILE/ENFILE) or memory: accepting again at
        // once would spin a core while the cause lasts. Say so, then retry.
        AcceptFailed(ec);
        return;
      } else if (state_.connections.load() >= max_connections_) {
        ErrorCode ignored;
        socket.close(ignored);
      } else {
        state_.connections.fetch_add(1);
        auto conn = std::make_shared<Connection>(std::move(socket), &state_);
        {
          absl::MutexLock lock(&state_.mu);
          // Forget connections that ended (keeps the list short).
          state_.registry.remove_if(
              [](const std::weak_ptr<Connection>& w) { return w.expired(); });
          state_.registry.push_back(conn);
        }
        conn->Begin();
      }
      if (!state_.draining.load()) Accept();
    });
  }

  void AcceptFailed(const ErrorCode& ec) {
    const absl::Time now = absl::Now();
    if (now - last_accept_warning_ >= absl::Seconds(10)) {
      last_accept_warning_ = now;
      PDSERVE_LOG_WARNING(
          "HTTP: cannot accept connections: %s (%d open; open-file limit "
          "%lld: raise `ulimit -n`); retrying every 100 ms",
          ec.message().c_str(), static_cast<int>(state_.connections.load()),
          static_cast<long long>(OpenFileLimit()));
    }
    accept_retry_.expires_after(std::chrono::milliseconds(100));
    accept_retry_.async_wait([this](ErrorCode wait_ec) {
      if (!wait_ec && !state_.draining.load()) Accept();
    });
  }

  void ForEachConnection(const std::function<void(Connection&)>& fn) {
    std::vector<std::shared_ptr<Connection>> live;
    {
      absl::MutexLock lock(&state_.mu);
      for (auto& w : state_.registry) {
        if (auto c = w.lock()) live.push_back(std::move(c));
      }
    }
    for (auto& c : live) fn(*c);
  }

  void StartDraining() {
    if (state_.draining.exchange(true)) return;
    net::post(ioc_, [this] {
      ErrorCode ignored;
      acceptor_.close(ignored);
    });
    ForEachConnection([](Connection& c) { c.CloseIfIdle(); });
  }

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    StartDraining();
    ForEachConnection([](Connection& c) { c.CloseNow(); });
    // Let the closes run, then stop the loop.
    for (int i = 0; i < 50 && state_.connections.load() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ioc_.stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  int port() const { return port_; }
  int active_requests() const { return state_.active_requests.load(); }

 private:
  static constexpr int64_t kReservedDescriptors = 256;

  ServerState state_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  net::steady_timer accept_retry_{ioc_};
  absl::Time last_accept_warning_ = absl::InfinitePast();
  size_t max_connections_ = 0;  // options.max_connections, within the limit
  std::vector<std::thread> threads_;
  int port_ = 0;
  bool stopped_ = false;
};

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const ServerOptions& options, Handler handler) {
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(); }
int Server::port() const { return impl_->port(); }
void Server::StartDraining() { impl_->StartDraining(); }
int Server::active_requests() const { return impl_->active_requests(); }
void Server::Stop() { impl_->Stop(); }

}  // namespace pdserve::http
