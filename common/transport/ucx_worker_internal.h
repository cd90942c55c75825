// State shared by the files of UcxWorker (ucx_worker.cc: context, progress
// thread, endpoints; ucx_ops.cc: sends and receives; ucx_memory.cc:
// registration). Not for use outside them.
#ifndef PDSERVE_COMMON_TRANSPORT_UCX_WORKER_INTERNAL_H_
#define PDSERVE_COMMON_TRANSPORT_UCX_WORKER_INTERNAL_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/ucx_worker.h"

namespace pdserve::transport {

// One endpoint to a peer worker, shared by the transfers with that peer.
// The bookkeeping fields belong to the progress thread; `ep` is read by
// threads posting operations and cleared by the progress thread, both under
// `mu` (nothing is posted on a closed endpoint).
struct UcxEndpointState
    : public std::enable_shared_from_this<UcxEndpointState> {
  UcxWorker* worker = nullptr;
  std::string key;  // endpoints_ key
  absl::Mutex mu;
  ucp_ep_h ep ABSL_GUARDED_BY(mu) = nullptr;  // null once closed
  bool failed = false;
  int users = 0;  // live UcxConnections
  absl::Time idle_since = absl::InfiniteFuture();
};

// One posted send or receive. UCX's completion callback holds a reference
// until it ran, so the state (and UCX's request, freed with it) outlives
// whoever posted it; a poster may cancel the request while it holds a
// reference.
struct UcxOpState {
  ~UcxOpState() {
    if (request != nullptr) ucp_request_free(request);
  }
  void Finish(ucs_status_t s, int64_t length) {
    absl::MutexLock lock(&mu);
    done = true;
    status = s;
    received = length;
  }
  bool Done() {
    absl::MutexLock lock(&mu);
    return done;
  }
  std::atomic<int64_t>* in_flight = nullptr;
  std::atomic<int64_t>* abandoned_count = nullptr;
  std::atomic<bool> abandoned{false};
  // The callback's bookkeeping: no longer in flight (nor abandoned).
  void Completed() {
    in_flight->fetch_sub(1);
    if (abandoned.exchange(false)) abandoned_count->fetch_sub(1);
  }
  void* request = nullptr;  // set by the poster before anyone can free it
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  ucs_status_t status ABSL_GUARDED_BY(mu) = UCS_OK;
  int64_t received ABSL_GUARDED_BY(mu) = 0;  // receives: message length
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_UCX_WORKER_INTERNAL_H_
