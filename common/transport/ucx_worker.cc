#include "common/transport/ucx_worker.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/transport/ucx_worker_internal.h"
#include "common/util/logging.h"

namespace pdserve::transport {

const std::string& UcxHostId() {
  static const std::string* const id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string boot;
    std::getline(in, boot);
    char host[256] = {};
    (void)gethostname(host, sizeof(host) - 1);
    return new std::string(
        absl::StrCat(absl::StripAsciiWhitespace(boot), "/", host));
  }();
  return *id;
}

bool UcxTlsAllowsSharedMemory(absl::string_view ucx_tls) {
  absl::string_view tls = absl::StripAsciiWhitespace(ucx_tls);
  if (tls.empty()) return true;
  const bool negate = absl::ConsumePrefix(&tls, "^");
  bool named = false;
  for (absl::string_view t : absl::StrSplit(tls, ',', absl::SkipEmpty())) {
    t = absl::StripAsciiWhitespace(t);
    if (t == "all") return !negate;
    for (absl::string_view sm :
         {"sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "mm"}) {
      named = named || t == sm;
    }
  }
  return negate ? !named : named;
}

absl::Status UcxError(absl::string_view what, int ucs_status) {
  const auto status = static_cast<ucs_status_t>(ucs_status);
  const std::string msg =
      absl::StrCat(what, ": UCX ", ucs_status_string(status));
  switch (status) {
    case UCS_ERR_CANCELED:
      return absl::CancelledError(msg);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(msg);
    case UCS_ERR_INVALID_PARAM:
      return absl::InvalidArgumentError(msg);
    case UCS_ERR_UNSUPPORTED:
      return absl::UnimplementedError(msg);
    default:
      // Unreachable peers, endpoint timeouts, resets, I/O errors.
      return absl::UnavailableError(msg);
  }
}

// UCX's endpoint-error callback; it runs inside ucp_worker_progress.
struct UcxCallbacks {
  static void EndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* state = static_cast<UcxEndpointState*>(arg);
    UcxWorker* w = state->worker;
    w->counters_.endpoint_errors.fetch_add(1);
    PDSERVE_LOG_WARNING("UCX endpoint error (peer gone?): %s",
                        ucs_status_string(status));
    // Closed after this progress call, not from inside the callback; new
    // transfers to that peer connect afresh. The progress thread is the
    // only one touching endpoints_ (errors reported while another thread
    // progresses are closed via the queue).
    w->Post([w, state = state->shared_from_this()] {
      state->failed = true;
      auto it = w->endpoints_.find(state->key);
      if (it != w->endpoints_.end() && it->second == state) {
        w->failed_.push_back(it->second);
        w->endpoints_.erase(it);
      }
    });
  }
};

UcxConnection::~UcxConnection() { worker_->Release(*this); }

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create() {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  absl::Notification ready;
  absl::Status init;
  // UCX is initialised on the thread that will drive it.
  w->thread_ = std::thread([p = w.get(), &ready, &init] {
    absl::Status s = p->Init();
    const bool ok = s.ok();
    init = std::move(s);
    ready.Notify();  // `init` and `ready` may be gone from here on
    if (ok) p->Run();
  });
  ready.WaitForNotification();
  if (!init.ok()) {
    w->thread_.join();
    return init;
  }
  return w;
}

absl::Status UcxWorker::Init() {
  const char* tls = std::getenv("UCX_TLS");
  transports_ = tls == nullptr || *tls == '\0' ? "all" : tls;
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxError("reading UCX configuration", s);
  // Settings pdserve needs from UCX unless the operator set them (UCX_*
  // in the environment wins):
  // - PROTO_INDIRECT_ID: endpoint and request ids on the wire as indirect
  //   keys, not pointers. When a peer without peer-failure mode (same-host
  //   prefill workers, so that UCX keeps its shared-memory transports)
  //   dies, UCX 1.13 destroys the endpoint it made for that peer while the
  //   peer's rendezvous announcements still wait in the unexpected queue;
  //   receiving or draining one then dereferences the freed endpoint and
  //   aborts the process in ucp_rndv_receive. With indirect ids UCX finds
  //   the endpoint gone and ends the receive (UCS_ERR_CANCELED).
  // - USE_MT_MUTEX: the worker lock (thread mode MULTI: the progress thread
  //   and the threads that send and receive) as a mutex, not a spinlock.
  //   A receive holds it through its CMA copy of a 4 MiB chunk, and the
  //   progress thread spun on it meanwhile: bench-kv-transfer's UCX push
  //   1.4x faster at 25% less CPU per GB without the spinning
  //   (docs/performance.md, "KV transfer").
  // - TCP_RX_SEG_SIZE: the TCP transport reads the socket into segments of
  //   this size and copies out of them; 512 KiB instead of 64 KiB takes 8x
  //   fewer reads of a chunk-sized rendezvous (bench-kv-transfer's
  //   UCX_TLS=tcp push: 1.20-1.25x the GB/s at 0.78-0.87x the CPU per GB,
  //   docs/performance.md "KV transfer"). Set as a UCT key (RX_SEG_SIZE,
  //   which only the TCP transport has), which ucp_config_modify keeps and
  //   applies to each transport that has it.
  struct Setting {
    const char* env;  // what the operator would set
    const char* key;  // what ucp_config_modify takes
    const char* value;
  };
  for (const Setting& setting :
       {Setting{"UCX_PROTO_INDIRECT_ID", "PROTO_INDIRECT_ID", "on"},
        Setting{"UCX_USE_MT_MUTEX", "USE_MT_MUTEX", "y"},
        Setting{"UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "512K"}}) {
    if (std::getenv(setting.env) != nullptr) continue;
    s = ucp_config_modify(config, setting.key, setting.value);
    if (s != UCS_OK) {
      ucp_config_release(config);
      return UcxError(absl::StrCat("setting ", setting.env), s);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // registrations from any thread
  params.name = "pdserve-kv";
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    return UcxError(absl::StrCat("initialising UCX with UCX_TLS=", transports_,
                                 " (are those transports and their devices "
                                 "there? ucx_info -d lists them)"),
                    s);
  }
  context_ = context;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;
  ucp_worker_h worker = nullptr;
  s = ucp_worker_create(context, &wp, &worker);
  if (s != UCS_OK) {
    ucp_cleanup(context);
    return UcxError("creating a UCX worker", s);
  }
  worker_ = worker;
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  int efd = -1;
  s = ucp_worker_get_address(worker, &addr, &len);
  if (s == UCS_OK) {
    address_.assign(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(worker, addr);
    s = ucp_worker_get_efd(worker, &efd);
  }
  if (s == UCS_OK) {
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    s = ucp_worker_query(worker, &attr);
    if (s == UCS_OK && attr.thread_mode != UCS_THREAD_MODE_MULTI) {
      s = UCS_ERR_UNSUPPORTED;  // a UCX built without multi-thread support
    }
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  bool fds_ok = wake_fd_ >= 0 && epoll_fd_ >= 0;
  for (int fd : {efd, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    fds_ok = fds_ok && epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
  }
  if (s != UCS_OK || !fds_ok) {
    const absl::Status err =
        s != UCS_OK ? UcxError("UCX worker address/event fd", s)
                    : absl::InternalError(absl::StrCat(
                          "UCX progress thread fds: ", strerror(errno)));
    if (wake_fd_ >= 0) close(wake_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    wake_fd_ = epoll_fd_ = -1;
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return err;
  }
  last_reap_ = absl::Now();
  return absl::OkStatus();
}

UcxWorker::~UcxWorker() {
  // Not joinable: Init failed, Create joined the thread and Init released
  // what it had made.
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(wake_fd_);
  close(epoll_fd_);
}

void UcxWorker::Wake() {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void UcxWorker::Post(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }
  Wake();
}

void UcxWorker::Call(const std::function<void()>& fn) {
  absl::Notification done;
  Post([&] {
    fn();
    done.Notify();
  });
  done.WaitForNotification();
}

void UcxWorker::Run() {
  auto worker = static_cast<ucp_worker_h>(worker_);
  while (true) {
    std::deque<std::function<void()>> work;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      work.swap(queue_);
      stopping = stop_;
    }
    for (auto& fn : work) fn();
    if (stopping && work.empty()) break;
    while (Progress() != 0) {
    }
    for (auto& ep : failed_) CloseEndpoint(*ep);
    failed_.clear();
    for (auto it = closing_.begin(); it != closing_.end();) {
      if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
        ++it;
      } else {
        ucp_request_free(*it);
        it = closing_.erase(it);
      }
    }
    if (!drains_.empty()) ProcessDrains();
    if (absl::Now() - last_reap_ >= absl::Seconds(1)) ReapIdleEndpoints();
    {
      absl::MutexLock lock(&mu_);
      if (!queue_.empty() || stop_) continue;
    }
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;  // events pending
    epoll_event events[2];
    // While operations are in flight, wake up at least every millisecond
    // (a transport may need progress without an event).
    const bool busy =
        counters_.ops_in_flight.load() > counters_.ops_abandoned.load() ||
        !closing_.empty();
    (void)epoll_wait(epoll_fd_, events, 2,
                     busy ? 1 : (drains_.empty() ? 1000 : 50));
    uint64_t n;
    (void)!read(wake_fd_, &n, sizeof(n));
  }
  // Shutdown: close every endpoint, finish the closes, release UCX (the
  // drain buffer only once nothing lands in it).
  drains_.clear();
  for (auto& [key, ep] : endpoints_) {
    CloseEndpoint(*ep);
  }
  endpoints_.clear();
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (!closing_.empty() && absl::Now() < deadline) {
    Progress();
    for (auto it = closing_.begin(); it != closing_.end();) {
      if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
        ++it;
      } else {
        ucp_request_free(*it);
        it = closing_.erase(it);
      }
    }
  }
  while ((drains_in_flight_.load() > 0 || counters_.ops_in_flight.load() > 0) &&
         absl::Now() < deadline) {
    Progress();
  }
  if (drains_in_flight_.load() > 0 || counters_.ops_in_flight.load() > 0) {
    // UCX aborts the process when a worker goes with operations on its
    // memory (a rendezvous with a peer that never answered): leave it all
    // to the process's exit.
    PDSERVE_LOG_WARNING(
        "UCX worker stopped with %lld operations in flight; not released",
        static_cast<long long>(counters_.ops_in_flight.load() +
                               drains_in_flight_.load()));
    (void)drain_buffer_.release();
    return;
  }
  drain_buffer_.reset();
  ucp_worker_destroy(worker);
  ucp_cleanup(static_cast<ucp_context_h>(context_));
}

absl::StatusOr<std::unique_ptr<UcxConnection>> UcxWorker::Connect(
    const std::string& peer_address, bool peer_errors) {
  // UCX aborts the process on an address it cannot parse: refuse one whose
  // header (the low 4 bits of its first byte: the address format version)
  // differs from this worker's own.
  if (peer_address.empty() || address_.empty() ||
      (peer_address[0] & 0x0f) != (address_[0] & 0x0f)) {
    return absl::InvalidArgumentError(
        "not a UCX worker address of this UCX's format");
  }
  absl::StatusOr<std::unique_ptr<UcxConnection>> out =
      absl::InternalError("unset");
  Call([&] {
    const std::string key =
        absl::StrCat(peer_errors ? "p:" : "n:", peer_address);
    std::shared_ptr<UcxEndpointState>& state = endpoints_[key];
    if (state == nullptr) {
      auto fresh = std::make_shared<UcxEndpointState>();
      fresh->worker = this;
      fresh->key = key;
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      ep.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
      ep.err_mode =
          peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      if (peer_errors) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_handler.cb = &UcxCallbacks::EndpointError;
        ep.err_handler.arg = fresh.get();
      }
      ucp_ep_h handle = nullptr;
      ucs_status_t st =
          ucp_ep_create(static_cast<ucp_worker_h>(worker_), &ep, &handle);
      if (st != UCS_OK) {
        endpoints_.erase(key);
        out = UcxError("connecting to the peer's UCX worker", st);
        return;
      }
      {
        absl::MutexLock lock(&fresh->mu);
        fresh->ep = handle;
      }
      counters_.endpoints.fetch_add(1);
      state = std::move(fresh);
    }
    ++state->users;
    state->idle_since = absl::InfiniteFuture();
    out = std::unique_ptr<UcxConnection>(new UcxConnection(this, state));
  });
  return out;
}

void UcxWorker::Release(UcxConnection& connection) {
  Call([&] {
    UcxEndpointState& ep = *connection.ep_;
    if (--ep.users == 0) ep.idle_since = absl::Now();
    if (ep.failed || (connection.close_when_unused_ && ep.users == 0)) {
      auto it = endpoints_.find(ep.key);
      if (it != endpoints_.end() && it->second.get() == &ep) {
        endpoints_.erase(it);
      }
      CloseEndpoint(ep);
    }
  });
  connection.ep_.reset();
}

void UcxWorker::Close(UcxConnection& connection) {
  Call([&] {
    UcxEndpointState& ep = *connection.ep_;
    auto it = endpoints_.find(ep.key);
    if (it != endpoints_.end() && it->second.get() == &ep) endpoints_.erase(it);
    CloseEndpoint(ep);
  });
}

void UcxWorker::CloseEndpoint(UcxEndpointState& ep) {
  absl::MutexLock lock(&ep.mu);
  ep.failed = true;
  if (ep.ep == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  // Operations still on it complete (cancelled) during the close.
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep.ep, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.push_back(r);
  ep.ep = nullptr;
  counters_.endpoints.fetch_sub(1);
}

void UcxWorker::ReapIdleEndpoints() {
  const absl::Time now = absl::Now();
  last_reap_ = now;
  for (auto it = endpoints_.begin(); it != endpoints_.end();) {
    UcxEndpointState& ep = *it->second;
    if (ep.users == 0 && now - ep.idle_since >= kEndpointIdle) {
      CloseEndpoint(ep);
      it = endpoints_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace pdserve::transport
