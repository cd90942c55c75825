#include "router/http/http_connection.h"

#include <deque>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/bind_executor.hpp"
#include "boost/asio/dispatch.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http.hpp"

namespace pdserve::http::internal {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;

namespace {

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
class Connection : public ConnectionControl,
                   public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ServerState* server)
      : socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        server_(server) {}

  void Begin() override {
    net::dispatch(socket_.get_executor(),
                  [self = shared_from_this()] { self->WaitForBytes(); });
  }
  // Draining: close now unless a request is in progress.
  void CloseIfIdle() override {
    net::post(socket_.get_executor(), [self = shared_from_this()] {
      if (self->responder_ == nullptr && !self->reading_) self->Close();
    });
  }
  void CloseNow() override {
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
        if (!c.head_) bytes += body;  // HEAD: the header GET would send
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
        if (!r.streaming_ || r.ended_ || c.head_) return;
        c.Enqueue(ChunkFrame(data), false);
      });
      return true;
    }
    void EndStream() override {
      Post([](Connection& c, ResponderImpl& r) {
        if (!r.streaming_ || r.ended_) return;
        r.ended_ = true;
        c.Enqueue(c.head_ ? "" : "0\r\n\r\n", /*last=*/true);
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
      if (call_now && on_gone) return on_gone();
      // The client may have half-closed before this request watched for it.
      Post([](Connection& c, ResponderImpl&) {
        if (c.peer_half_closed_) c.Close();
      });
    }
    // Whether the handler watches for the client leaving (a generation).
    bool WatchesClient() {
      absl::MutexLock lock(&mu_);
      return on_gone_ != nullptr;
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
      if (ec == net::error::eof && self->responder_ != nullptr) {
        return self->OnHalfClosedWhileAnswering();
      }
      if (ec) return self->Close();
      self->buffer_.commit(n);
      // Answering: the next request waits until this one is done.
      if (self->responder_ == nullptr) self->ReadRequest();
    });
  }

  // The client shut its side (EOF) while its request is answered, as
  // `printf ... | nc -N` does. A handler watching for the client leaving (a
  // generation) takes it as gone, as Go's and uvicorn's servers do; any
  // other answer is still written, then the connection closes.
  void OnHalfClosedWhileAnswering() {
    peer_half_closed_ = true;
    keep_alive_ = false;
    if (responder_->WatchesClient()) Close();
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
    // HEAD is GET without the body (RFC 9110 9.3.2): the handler sees GET.
    head_ = message.method() == bhttp::verb::head;
    if (head_) request.method = "GET";
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
    // Notice a disconnect while answering. Not when the client has already
    // sent its next request (pipelining): those bytes wait in buffer_ for
    // this answer to complete, which reads them (WaitForBytes) rather than
    // waiting on the socket for bytes that may never come.
    if (buffer_.size() == 0) WaitForBytes();
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
    // The count is of open sockets (descriptors), not of objects: a
    // Responder kept by a request still finishing keeps this object, not a
    // descriptor.
    server_->connections.fetch_sub(1);
    if (responder_ != nullptr) {
      std::shared_ptr<ResponderImpl> r = std::move(responder_);
      server_->active_requests.fetch_sub(1);
      r->MarkGone();
    }
  }

 public:
  ~Connection() {
    if (!closed_) server_->connections.fetch_sub(1);
  }

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
  bool head_ = false;  // the request in progress is HEAD: no body is sent
  bool reading_ = false;
  bool watching_ = false;
  bool writing_ = false;
  bool response_complete_ = false;
  bool close_after_write_ = false;
  bool peer_half_closed_ = false;  // EOF read: no more requests will come
  bool closed_ = false;
};

}  // namespace

std::shared_ptr<ConnectionControl> NewConnection(tcp::socket socket,
                                                 ServerState* server) {
  return std::make_shared<Connection>(std::move(socket), server);
}

}  // namespace pdserve::http::internal
