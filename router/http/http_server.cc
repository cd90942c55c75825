#include "router/http/http_server.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/beast/http/status.hpp"
#include "common/util/fd_limit.h"
#include "common/util/logging.h"
#include "router/http/http_connection.h"

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

using internal::ConnectionControl;
using internal::NewConnection;
using internal::ServerState;

// Listens, accepts (within the connection cap), drains and stops; the
// connections themselves are http_connection's. Thread-safe as Server is.
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
    acceptor_.async_accept(
        net::make_strand(ioc_), [this](ErrorCode ec, tcp::socket socket) {
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
            std::shared_ptr<ConnectionControl> conn =
                NewConnection(std::move(socket), &state_);
            {
              absl::MutexLock lock(&state_.mu);
              // Forget connections that ended (keeps the list short).
              state_.registry.remove_if(
                  [](const std::weak_ptr<ConnectionControl>& w) {
                    return w.expired();
                  });
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

  void ForEachConnection(const std::function<void(ConnectionControl&)>& fn) {
    std::vector<std::shared_ptr<ConnectionControl>> live;
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
    ForEachConnection([](ConnectionControl& c) { c.CloseIfIdle(); });
  }

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    StartDraining();
    ForEachConnection([](ConnectionControl& c) { c.CloseNow(); });
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
