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

// One endpoint to a peer worker, shared by the transfers with that peer.
// The bookkeeping fields belong to the progress thread; `ep` is read by
// threads posting gets and cleared by the progress thread, both under `mu`
// (a get is never posted on a closed endpoint).
struct UcxEndpointState {
  UcxWorker* worker = nullptr;
  std::string key;  // endpoints_ key
  absl::Mutex mu;
  ucp_ep_h ep ABSL_GUARDED_BY(mu) = nullptr;  // null once closed
  bool failed = false;
  int users = 0;  // live UcxRemoteRegions
  absl::Time idle_since = absl::InfiniteFuture();
};

namespace {

// One get in flight; its poster waits for it (closing the endpoint
// completes it), so the poster's reference keeps it alive.
struct GetOp {
  UcxWorker* worker = nullptr;
  std::atomic<int>* in_flight = nullptr;
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  ucs_status_t status ABSL_GUARDED_BY(mu) = UCS_OK;
  void Finish(ucs_status_t s) {
    absl::MutexLock lock(&mu);
    done = true;
    status = s;
  }
};

}  // namespace

// UCX's C callbacks; they run on the progress thread, inside
// ucp_worker_progress.
struct UcxCallbacks {
  static void EndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* state = static_cast<UcxEndpointState*>(arg);
    UcxWorker* w = state->worker;
    w->counters_.endpoint_errors.fetch_add(1);
    PDSERVE_LOG_WARNING("UCX endpoint error (peer gone?): %s",
                        ucs_status_string(status));
    state->failed = true;
    // Closed once progress returns, not from inside the callback; new
    // transfers to that peer connect afresh.
    auto it = w->endpoints_.find(state->key);
    if (it != w->endpoints_.end() && it->second.get() == state) {
      w->failed_.push_back(it->second);
      w->endpoints_.erase(it);
    }
  }
  static void GetDone(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<GetOp*>(user_data);
    ucp_request_free(request);
    op->in_flight->fetch_sub(1);
    op->Finish(status);
  }
};

UcxRemoteRegion::~UcxRemoteRegion() { worker_->Release(*this); }

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
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // registrations from any thread
  params.name = "pdserve-kv";
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("initialising UCX", s);
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
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return err;
  }
  last_reap_ = absl::Now();
  return absl::OkStatus();
}

UcxWorker::~UcxWorker() {
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
    while (ucp_worker_progress(worker) != 0) {
    }
    for (auto& ep : failed_) CloseEndpoint(*ep, /*force=*/true);
    failed_.clear();
    for (auto it = closing_.begin(); it != closing_.end();) {
      if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
        ++it;
      } else {
        ucp_request_free(*it);
        it = closing_.erase(it);
      }
    }
    if (absl::Now() - last_reap_ >= absl::Seconds(1)) ReapIdleEndpoints();
    {
      absl::MutexLock lock(&mu_);
      if (!queue_.empty() || stop_) continue;
    }
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;  // events pending
    epoll_event events[2];
    // While operations are in flight, wake up at least every millisecond
    // (a transport may need progress without an event).
    const bool busy = gets_in_flight_.load() > 0 || !closing_.empty();
    (void)epoll_wait(epoll_fd_, events, 2, busy ? 1 : 1000);
    uint64_t n;
    (void)!read(wake_fd_, &n, sizeof(n));
  }
  // Shutdown: close every endpoint, finish the closes, release UCX.
  for (auto& [key, ep] : endpoints_) {
    CloseEndpoint(*ep, /*force=*/true);
  }
  endpoints_.clear();
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (!closing_.empty() && absl::Now() < deadline) {
    ucp_worker_progress(worker);
    for (auto it = closing_.begin(); it != closing_.end();) {
      if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
        ++it;
      } else {
        ucp_request_free(*it);
        it = closing_.erase(it);
      }
    }
  }
  ucp_worker_destroy(worker);
  ucp_cleanup(static_cast<ucp_context_h>(context_));
}

absl::StatusOr<std::unique_ptr<UcxRemoteRegion>> UcxWorker::Attach(
    const std::string& peer_address, bool peer_errors,
    const std::string& packed_rkey, uint64_t address, int64_t size) {
  // UCX aborts the process on an address it cannot parse: refuse one whose
  // header (the low 4 bits of its first byte: the address format version)
  // differs from this worker's own.
  if (peer_address.empty() || address_.empty() ||
      (peer_address[0] & 0x0f) != (address_[0] & 0x0f)) {
    return absl::InvalidArgumentError(
        "not a UCX worker address of this UCX's format");
  }
  absl::StatusOr<std::unique_ptr<UcxRemoteRegion>> out =
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
    std::unique_ptr<UcxRemoteRegion> remote(
        new UcxRemoteRegion(this, state, address, size));
    ucp_rkey_h rkey = nullptr;
    ucs_status_t st;
    {
      absl::MutexLock lock(&state->mu);
      st = ucp_ep_rkey_unpack(state->ep, packed_rkey.data(), &rkey);
    }
    if (st != UCS_OK) {
      state->idle_since = state->users == 0 ? absl::Now() : state->idle_since;
      remote->ep_ = nullptr;
      out = UcxError("unpacking the peer's remote key", st);
      return;
    }
    remote->rkey_ = rkey;
    counters_.remote_keys.fetch_add(1);
    ++state->users;
    state->idle_since = absl::InfiniteFuture();
    out = std::move(remote);
  });
  return out;
}

void UcxWorker::Release(UcxRemoteRegion& remote) {
  if (remote.ep_ == nullptr) return;
  Call([&] {
    if (remote.rkey_ != nullptr) {
      ucp_rkey_destroy(static_cast<ucp_rkey_h>(remote.rkey_));
      counters_.remote_keys.fetch_sub(1);
    }
    UcxEndpointState& ep = *remote.ep_;
    if (--ep.users == 0) ep.idle_since = absl::Now();
    if (remote.poisoned_ || ep.failed ||
        (remote.close_when_unused_ && ep.users == 0)) {
      auto it = endpoints_.find(ep.key);
      if (it != endpoints_.end() && it->second.get() == &ep) {
        endpoints_.erase(it);
      }
      CloseEndpoint(ep, /*force=*/true);
    }
  });
  remote.ep_.reset();
}

void UcxWorker::Poison(UcxRemoteRegion& remote) {
  remote.poisoned_ = true;
  Call([&] {
    UcxEndpointState& ep = *remote.ep_;
    auto it = endpoints_.find(ep.key);
    if (it != endpoints_.end() && it->second.get() == &ep) endpoints_.erase(it);
    CloseEndpoint(ep, /*force=*/true);
  });
}

void UcxWorker::CloseEndpoint(UcxEndpointState& ep, bool force) {
  absl::MutexLock lock(&ep.mu);
  if (ep.ep == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  // Outstanding gets on it complete (cancelled) during the close.
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep.ep, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.push_back(r);
  ep.ep = nullptr;
  ep.failed = true;
  counters_.endpoints.fetch_sub(1);
}

void UcxWorker::ReapIdleEndpoints() {
  const absl::Time now = absl::Now();
  last_reap_ = now;
  for (auto it = endpoints_.begin(); it != endpoints_.end();) {
    UcxEndpointState& ep = *it->second;
    if (ep.users == 0 && now - ep.idle_since >= kEndpointIdle) {
      CloseEndpoint(ep, /*force=*/true);
      it = endpoints_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status UcxWorker::Get(UcxRemoteRegion& remote, int64_t remote_offset,
                            UcxRegion& local, int64_t local_offset,
                            int64_t bytes,
                            const std::function<bool()>& cancelled) {
  if (remote_offset < 0 || bytes < 0 || remote_offset > remote.size_ ||
      bytes > remote.size_ - remote_offset || local_offset < 0 ||
      local_offset > local.size() || bytes > local.size() - local_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX get of ", bytes, " bytes at ", remote_offset,
                     " outside a ", remote.size_, "-byte region (or the ",
                     local.size(), "-byte landing buffer)"));
  }
  if (remote.ep_ == nullptr) {
    return absl::FailedPreconditionError("UCX remote region is released");
  }
  auto op = std::make_shared<GetOp>();
  op->worker = this;
  op->in_flight = &gets_in_flight_;
  {
    // Posted from this thread: over shared memory (CMA) the copy happens
    // right here and the get completes at once; otherwise the progress
    // thread completes it.
    UcxEndpointState& ep = *remote.ep_;
    absl::MutexLock lock(&ep.mu);
    if (ep.ep == nullptr) {
      op->Finish(UCS_ERR_CONNECTION_RESET);
    } else {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
      p.cb.send = &UcxCallbacks::GetDone;
      p.user_data = op.get();
      p.memh = static_cast<ucp_mem_h>(local.memh());
      gets_in_flight_.fetch_add(1);
      ucs_status_ptr_t r = ucp_get_nbx(
          ep.ep, local.data() + local_offset, static_cast<size_t>(bytes),
          remote.address_ + static_cast<uint64_t>(remote_offset),
          static_cast<ucp_rkey_h>(remote.rkey_), &p);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) {
        gets_in_flight_.fetch_sub(1);
        op->Finish(r == nullptr ? UCS_OK : UCS_PTR_STATUS(r));
      } else {
        Wake();  // GetDone (on the progress thread) finishes it
      }
    }
  }
  absl::Time cancelled_at = absl::InfiniteFuture();
  bool closed = false;
  absl::MutexLock lock(&op->mu);
  while (!op->done) {
    op->mu.AwaitWithTimeout(absl::Condition(&op->done), absl::Milliseconds(20));
    if (op->done || closed || !cancelled()) continue;
    const absl::Time now = absl::Now();
    if (cancelled_at == absl::InfiniteFuture()) cancelled_at = now;
    if (now - cancelled_at >= kCancelGrace) {
      // The peer does not complete the get: close the endpoint, which
      // completes it (cancelled) before the landing buffer is reused.
      closed = true;
      op->mu.Unlock();
      Poison(remote);
      op->mu.Lock();
    }
  }
  if (op->status == UCS_OK) return absl::OkStatus();
  if (closed || cancelled_at != absl::InfiniteFuture()) {
    return absl::CancelledError("KV transfer cancelled during a UCX get");
  }
  return UcxError("UCX get from the prefill worker", op->status);
}

}  // namespace pdserve::transport
