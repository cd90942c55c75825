// UcxWorker: this process's UCX (UCP) context and worker, the engine under
// the UCX KV transport. A progress thread sleeps on UCX's event fd and
// drives completions, endpoint errors and endpoint bookkeeping; callers post
// gets themselves (the worker is multi-threaded, so a shared-memory get
// completes in the caller's own thread without a hand-off). It registers
// memory once per long-lived buffer (host or CUDA memory, the type named per
// registration), keeps one endpoint per peer worker (shared by that peer's
// transfers, closed on a UCX endpoint error, after a failed transfer or when
// idle, so a restarted peer gets a fresh one), unpacks remote keys and runs
// one-sided gets. UCX reads its own settings from the environment (UCX_TLS,
// UCX_NET_DEVICES, ...). Thread-safe. (Registration: ucx_memory.cc.)
#ifndef PDSERVE_COMMON_TRANSPORT_UCX_WORKER_H_
#define PDSERVE_COMMON_TRANSPORT_UCX_WORKER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pdserve::transport {

// Where registered memory lives: host memory, or CUDA device memory (moved
// by UCX's cuda_copy / cuda_ipc transports when UCX is built with CUDA).
enum class UcxMemoryType { kHost, kCuda };
absl::string_view UcxMemoryTypeName(UcxMemoryType type);
absl::StatusOr<UcxMemoryType> ParseUcxMemoryType(absl::string_view name);

// This process's host identity: the kernel's boot id and the host name.
// Two processes with the same id may reach each other through shared memory
// (containers on one node differ by host name, as UCX sees them too).
const std::string& UcxHostId();

// Whether a UCX_TLS value leaves UCX its shared-memory transports (sm,
// posix, sysv, cma, ...): empty, "all", naming one, or a "^" list not
// naming them.
bool UcxTlsAllowsSharedMemory(absl::string_view ucx_tls);

// `what` failed with UCX status `ucs_status` (a ucs_status_t), as a Status:
// CANCELLED, RESOURCE_EXHAUSTED, INVALID_ARGUMENT, UNIMPLEMENTED, else
// UNAVAILABLE (unreachable or dead peer, I/O error).
absl::Status UcxError(absl::string_view what, int ucs_status);

// Resources a worker holds, for metrics and leak checks.
struct UcxCounters {
  std::atomic<int64_t> endpoints{0};      // open endpoints
  std::atomic<int64_t> remote_keys{0};    // unpacked, not yet destroyed
  std::atomic<int64_t> registrations{0};  // registered regions
  std::atomic<int64_t> registered_bytes{0};
  std::atomic<int64_t> endpoint_errors{0};  // UCX endpoint errors seen
};

class UcxWorker;
struct UcxEndpointState;

// Memory registered with UCX for this object's lifetime, with the packed
// remote key through which a peer reads it.
class UcxRegion {
 public:
  ~UcxRegion();  // unregisters (and frees memory Allocate allocated)
  UcxRegion(const UcxRegion&) = delete;
  UcxRegion& operator=(const UcxRegion&) = delete;

  char* data() const { return data_; }
  int64_t size() const { return size_; }
  UcxMemoryType memory_type() const { return type_; }
  const std::string& packed_rkey() const { return rkey_; }
  void* memh() const { return memh_; }  // ucp_mem_h

 private:
  friend class UcxWorker;
  UcxRegion(UcxWorker* worker, char* data, int64_t size, UcxMemoryType type,
            bool owned)
      : worker_(worker), data_(data), size_(size), type_(type), owned_(owned) {}
  UcxWorker* const worker_;
  char* const data_;
  const int64_t size_;
  const UcxMemoryType type_;
  const bool owned_;
  void* memh_ = nullptr;
  std::string rkey_;
};

// A peer's region as this process sees it: an endpoint to the peer plus the
// unpacked remote key. Holding one keeps the endpoint open.
class UcxRemoteRegion {
 public:
  ~UcxRemoteRegion();  // destroys the key, releases the endpoint
  UcxRemoteRegion(const UcxRemoteRegion&) = delete;
  UcxRemoteRegion& operator=(const UcxRemoteRegion&) = delete;
  uint64_t address() const { return address_; }
  int64_t size() const { return size_; }

 private:
  friend class UcxWorker;
  UcxRemoteRegion(UcxWorker* worker, std::shared_ptr<UcxEndpointState> ep,
                  uint64_t address, int64_t size)
      : worker_(worker), ep_(std::move(ep)), address_(address), size_(size) {}
  UcxWorker* const worker_;
  std::shared_ptr<UcxEndpointState> ep_;
  const uint64_t address_;
  const int64_t size_;
  void* rkey_ = nullptr;  // ucp_rkey_h
  // The peer is presumed dead: the endpoint is closed when this is
  // released, whoever else uses it.
  bool poisoned_ = false;
  // The transfer failed: the endpoint is closed if nobody else uses it.
  bool close_when_unused_ = false;
};

class UcxWorker {
 public:
  // Endpoints unused for this long are closed (a later transfer reconnects).
  static constexpr absl::Duration kEndpointIdle = absl::Seconds(30);
  // How long a get may outlive its caller's cancellation before its
  // endpoint is closed to end it (the peer is presumed gone).
  static constexpr absl::Duration kCancelGrace = absl::Seconds(1);

  // Initialises UCX (features: RMA, wakeup) and starts the progress thread.
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create();
  ~UcxWorker();  // closes endpoints, stops the thread, cleans UCX up
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // The packed worker address a peer connects to.
  const std::string& address() const { return address_; }
  // The transports UCX may use (UCX_TLS when this worker started; "all"
  // when unset).
  const std::string& transports() const { return transports_; }

  // Allocates `bytes` of page-aligned host memory and registers it.
  absl::StatusOr<std::unique_ptr<UcxRegion>> Allocate(int64_t bytes);
  // Registers memory the caller owns (kCuda: device memory; needs a UCX
  // built with CUDA support). The memory must outlive the region.
  absl::StatusOr<std::unique_ptr<UcxRegion>> Register(void* data, int64_t bytes,
                                                      UcxMemoryType type);

  // Connects (or reuses the endpoint) to the worker at `peer_address` and
  // unpacks `packed_rkey` for [address, address + size) there.
  // `peer_errors`: UCX detects a dead peer (UCP_ERR_HANDLING_MODE_PEER);
  // UCX 1.13 then uses no shared-memory transport, so same-host peers pass
  // false and rely on the control stream to notice a dead peer.
  // UNAVAILABLE when UCX cannot reach the peer.
  absl::StatusOr<std::unique_ptr<UcxRemoteRegion>> Attach(
      const std::string& peer_address, bool peer_errors,
      const std::string& packed_rkey, uint64_t address, int64_t size);

  // Reads [remote_offset, + bytes) of `remote` into `local` at
  // `local_offset`; waits until done. When `cancelled()` turns true first,
  // waits up to kCancelGrace, then closes the endpoint to end the get
  // (CANCELLED). UNAVAILABLE when the endpoint fails.
  absl::Status Get(UcxRemoteRegion& remote, int64_t remote_offset,
                   UcxRegion& local, int64_t local_offset, int64_t bytes,
                   const std::function<bool()>& cancelled);

  // Closes the endpoint of `remote` now (its other users' operations fail);
  // for a transfer whose peer is presumed dead.
  void Poison(UcxRemoteRegion& remote);
  // Closes the endpoint of `remote` when its last user releases it (instead
  // of caching it): for a failed transfer whose peer may be gone.
  void CloseWhenUnused(UcxRemoteRegion& remote) {
    remote.close_when_unused_ = true;
  }

  const UcxCounters& counters() const { return counters_; }

 private:
  friend class UcxRegion;
  friend class UcxRemoteRegion;
  friend struct UcxCallbacks;  // UCX's C callbacks (ucx_worker.cc)
  UcxWorker() = default;
  absl::Status Init();
  void Run();
  // Runs `fn` on the progress thread and waits for it.
  void Call(const std::function<void()>& fn);
  // Queues `fn` for the progress thread.
  void Post(std::function<void()> fn);
  // Progress thread: endpoints.
  void CloseEndpoint(UcxEndpointState& ep, bool force);
  void ReapIdleEndpoints();
  void Release(UcxRemoteRegion& remote);
  // Registers `region`'s memory and packs its remote key (ucx_memory.cc).
  absl::Status MapRegion(UcxRegion& region);
  void Unregister(UcxRegion& region);
  void Wake();

  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  std::string address_;
  std::string transports_;
  int wake_fd_ = -1;   // eventfd: work queued
  int epoll_fd_ = -1;  // worker efd + wake_fd_
  UcxCounters counters_;
  std::atomic<int> gets_in_flight_{0};  // the progress thread polls while > 0

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;

  // Progress thread only.
  std::map<std::string, std::shared_ptr<UcxEndpointState>> endpoints_;
  std::vector<std::shared_ptr<UcxEndpointState>> failed_;  // to close
  std::vector<void*> closing_;  // ucp_ep_close_nbx requests in flight
  absl::Time last_reap_;
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_UCX_WORKER_H_
