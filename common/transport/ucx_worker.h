// UcxWorker: this process's UCX (UCP) context and worker, the engine under
// the UCX KV transport. A progress thread sleeps on UCX's event fd and
// drives completions, endpoint errors and endpoint bookkeeping; callers post
// tagged sends and receives themselves and drive them a little before
// leaving them to it (the worker is multi-threaded, so a shared-memory
// rendezvous completes in the caller's thread without a hand-off). It
// registers memory once per long-lived buffer (host or CUDA memory, the
// type named per registration), keeps one endpoint per peer worker (shared
// by the transfers to that peer, closed on a UCX endpoint error, when a
// transfer's sends cannot complete, or when idle, so a restarted peer gets a
// fresh one). UCX reads its own settings from the environment (UCX_TLS,
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
  std::atomic<int64_t> endpoints{0};  // open endpoints
  std::atomic<int64_t> registrations{0};
  std::atomic<int64_t> registered_bytes{0};
  std::atomic<int64_t> endpoint_errors{0};  // UCX endpoint errors seen
  std::atomic<int64_t> ops_in_flight{0};    // sends and receives posted
  std::atomic<int64_t> ops_abandoned{0};    // of those: given up on
  std::atomic<int64_t> drained{0};  // messages of failed transfers discarded
};

class UcxWorker;
class UcxConnection;
struct UcxEndpointState;
struct UcxOpState;

// Memory registered with UCX for this object's lifetime.
class UcxRegion {
 public:
  ~UcxRegion();  // unregisters (and frees memory Allocate allocated)
  UcxRegion(const UcxRegion&) = delete;
  UcxRegion& operator=(const UcxRegion&) = delete;

  char* data() const { return data_; }
  int64_t size() const { return size_; }
  UcxMemoryType memory_type() const { return type_; }
  void* memh() const { return memh_; }  // ucp_mem_h
  // The packed remote key of memory UCX allocated (AllocateShared), which a
  // peer on this host may map (UcxRemoteMemory); empty for other regions.
  const std::string& packed_rkey() const { return packed_rkey_; }

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
  std::string packed_rkey_;
};

// A peer's memory (a region it allocated with AllocateShared) mapped into
// this process through UCX (ucp_rkey_ptr: shared memory on one host), with
// the endpoint to the peer it was unpacked on. Thread-safe (read-only).
class UcxRemoteMemory {
 public:
  ~UcxRemoteMemory();  // destroys the key (unmaps), then the connection
  UcxRemoteMemory(const UcxRemoteMemory&) = delete;
  UcxRemoteMemory& operator=(const UcxRemoteMemory&) = delete;
  // Where the peer's `address` is mapped here; nullptr when the key does
  // not map (another host, another IPC namespace, a TCP-only UCX).
  void* Pointer(uint64_t address) const;
  UcxConnection& connection() const { return *connection_; }

 private:
  friend class UcxWorker;
  UcxRemoteMemory(std::unique_ptr<UcxConnection> connection, void* rkey)
      : connection_(std::move(connection)), rkey_(rkey) {}
  std::unique_ptr<UcxConnection> connection_;
  void* const rkey_;  // ucp_rkey_h
};

// A use of the endpoint to one peer worker; the endpoint stays open while
// any connection to it lives (and is cached a while after).
class UcxConnection {
 public:
  ~UcxConnection();
  UcxConnection(const UcxConnection&) = delete;
  UcxConnection& operator=(const UcxConnection&) = delete;
  // The transfer failed (the peer may be gone): when this is released and
  // no other connection uses the endpoint, close it instead of caching it.
  void CloseWhenUnused() { close_when_unused_ = true; }

 private:
  friend class UcxWorker;
  UcxConnection(UcxWorker* worker, std::shared_ptr<UcxEndpointState> ep)
      : worker_(worker), ep_(std::move(ep)) {}
  UcxWorker* const worker_;
  std::shared_ptr<UcxEndpointState> ep_;
  bool close_when_unused_ = false;
};

// A posted send; the memory it reads must stay until it is done.
class UcxSendOp {
 public:
  // Waits up to `timeout` (the progress thread completes it); true when
  // done.
  bool Wait(absl::Duration timeout);
  // The outcome once done (CANCELLED when its endpoint was closed).
  absl::Status status() const;
  // Stops counting it as in flight (the progress thread stops polling for
  // it): a send UCX will not end, a rendezvous whose peer died on a
  // transport without peer-failure detection, even after its endpoint was
  // closed (UCX 1.13 over shared memory). Its memory must stay untouched by
  // the peer, which is gone.
  void Abandon();

 private:
  friend class UcxWorker;
  UcxWorker* worker_ = nullptr;
  std::shared_ptr<UcxOpState> op_;
};

// A posted receive (UcxWorker::PostReceive); its region must stay until
// AwaitReceive returned or CancelReceive returned true.
class UcxRecvOp {
 public:
  bool posted() const { return op_ != nullptr; }
  uint64_t tag() const { return tag_; }

 private:
  friend class UcxWorker;
  std::shared_ptr<UcxOpState> op_;
  int64_t bytes_ = 0;
  uint64_t tag_ = 0;
};

class UcxWorker {
 public:
  // Endpoints unused for this long are closed (a later transfer reconnects).
  static constexpr absl::Duration kEndpointIdle = absl::Seconds(30);
  // Progress calls an operation's poster makes before leaving it to the
  // progress thread.
  static constexpr int kInlineProgress = 32;
  // How long a receive may outlive its caller's cancellation before it is
  // cancelled in UCX.
  static constexpr absl::Duration kCancelGrace = absl::Seconds(1);

  // Initialises UCX (features: tag, wakeup) and starts the progress thread.
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
  // Host memory UCX allocates and registers itself (System V or POSIX
  // shared memory when its shared-memory transports are enabled), with its
  // packed remote key: a peer on this host can map it (UcxRemoteMemory).
  absl::StatusOr<std::unique_ptr<UcxRegion>> AllocateShared(int64_t bytes);
  // Unpacks a peer's packed remote key on an endpoint to `peer_address`
  // (Connect without peer-failure detection: same host).
  absl::StatusOr<std::unique_ptr<UcxRemoteMemory>> MapRemote(
      const std::string& peer_address, const std::string& packed_rkey);
  // Registers memory the caller owns (kCuda: device memory; needs a UCX
  // built with CUDA support). The memory must outlive the region.
  absl::StatusOr<std::unique_ptr<UcxRegion>> Register(void* data, int64_t bytes,
                                                      UcxMemoryType type);

  // A connection to the worker at `peer_address` (its endpoint is created
  // on first use and cached). `peer_errors`: UCX detects a dead peer
  // (UCP_ERR_HANDLING_MODE_PEER); UCX 1.13 then uses no shared-memory
  // transport, so same-host peers pass false and rely on the control stream
  // to notice a dead peer. INVALID_ARGUMENT for an address of another
  // format, UNAVAILABLE when UCX cannot reach the peer.
  absl::StatusOr<std::unique_ptr<UcxConnection>> Connect(
      const std::string& peer_address, bool peer_errors);
  // Closes the connection's endpoint now: its operations complete
  // (cancelled), other connections to that peer fail too. For a peer that
  // is gone or stopped receiving.
  void Close(UcxConnection& connection);

  // Sends [offset, + bytes) of `region` with `tag` (a rendezvous for large
  // messages: the receiver pulls the bytes, over shared memory with one CMA
  // copy). The region must stay until the send is done.
  absl::StatusOr<UcxSendOp> Send(UcxConnection& connection,
                                 const UcxRegion& region, int64_t offset,
                                 int64_t bytes, uint64_t tag);
  // Receives the message tagged `tag` (from any peer) into [offset, +
  // bytes) of `region`; waits until it arrived and returns its length. When
  // `cancelled()` turns true first, waits up to kCancelGrace, then cancels
  // it (CANCELLED); ABORTED when UCX does not end it even then (`region`
  // must not be reused). DATA_LOSS when the message is larger than `bytes`.
  absl::StatusOr<int64_t> Receive(UcxRegion& region, int64_t offset,
                                  int64_t bytes, uint64_t tag,
                                  const std::function<bool()>& cancelled);
  // Receive in two steps, so that a receiver can post the next message's
  // receive before it works on this one (the transfer then overlaps its
  // work): posts the receive, ...
  absl::StatusOr<UcxRecvOp> PostReceive(UcxRegion& region, int64_t offset,
                                        int64_t bytes, uint64_t tag);
  // ... then waits for it as Receive does (the op is spent afterwards).
  absl::StatusOr<int64_t> AwaitReceive(UcxRecvOp& op,
                                       const std::function<bool()>& cancelled);
  // Cancels a posted receive (one that no message matched ends at once);
  // true when it ended within `timeout`, else its region may still be
  // written and must not be reused. The op is spent afterwards.
  bool CancelReceive(UcxRecvOp& op, absl::Duration timeout);
  // For `duration`, receives and discards the messages whose tag matches
  // `tag` under `mask`: what a peer sends for a transfer that failed here,
  // so that its sends complete rather than wait forever (UCX 1.13 cannot
  // cancel a rendezvous send). Runs on the progress thread.
  void DrainLater(uint64_t tag, uint64_t mask, absl::Duration duration);

  const UcxCounters& counters() const { return counters_; }

 private:
  friend class UcxRegion;
  friend class UcxConnection;
  friend class UcxSendOp;
  friend struct UcxCallbacks;  // UCX's C callbacks (ucx_worker.cc)
  UcxWorker() = default;
  absl::Status Init();
  void Run();
  // Runs `fn` on the progress thread and waits for it.
  void Call(const std::function<void()>& fn);
  // Queues `fn` for the progress thread.
  void Post(std::function<void()> fn);
  void Wake();
  // ucp_worker_progress under progress_mu_ (every progress call goes
  // through it).
  unsigned Progress();
  // ucp_request_cancel of op's request under progress_mu_, then Wake.
  void CancelRequest(UcxOpState& op);
  // Progresses the worker from the caller's thread until `op` is done or
  // kInlineProgress calls made no difference, then leaves it to the
  // progress thread.
  void Drive(UcxOpState& op);
  // Progress thread: discards messages of failed transfers (DrainLater).
  void ProcessDrains();
  // Progress thread: endpoints.
  void CloseEndpoint(UcxEndpointState& ep);
  void ReapIdleEndpoints();
  void Release(UcxConnection& connection);
  // Registers `region`'s memory (ucx_memory.cc).
  absl::Status MapRegion(UcxRegion& region);
  void Unregister(UcxRegion& region);

  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  std::string address_;
  std::string transports_;
  int wake_fd_ = -1;   // eventfd: work queued
  int epoll_fd_ = -1;  // worker efd + wake_fd_
  UcxCounters counters_;

  absl::Mutex mu_;
  // Held around every ucp_worker_progress and ucp_request_cancel (Progress,
  // CancelRequest): a cancel must not run beside a progress call.
  absl::Mutex progress_mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;

  // Progress thread only.
  std::map<std::string, std::shared_ptr<UcxEndpointState>> endpoints_;
  std::vector<std::shared_ptr<UcxEndpointState>> failed_;  // to close
  std::vector<void*> closing_;  // ucp_ep_close_nbx requests in flight
  absl::Time last_reap_;
  struct Drainer {
    uint64_t tag;
    uint64_t mask;
    absl::Time until;
  };
  std::vector<Drainer> drains_;
  std::unique_ptr<UcxRegion> drain_buffer_;  // discarded messages land here
  std::atomic<int64_t> drains_in_flight_{0};
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_UCX_WORKER_H_
