// SerialQueue: runs posted functions one at a time, in the order posted, on
// whichever thread posts into an idle queue (no thread of its own). It turns
// callbacks arriving from gRPC's threads, HTTP connections and timers into a
// sequential actor: state touched only inside posted functions needs no lock,
// and a callback that fires inline while a function runs just queues behind
// it. Thread-safe.
#ifndef PDSERVE_ROUTER_SERIAL_QUEUE_H_
#define PDSERVE_ROUTER_SERIAL_QUEUE_H_

#include <deque>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pdserve {

class SerialQueue {
 public:
  void Post(std::function<void()> fn) {
    {
      absl::MutexLock lock(&mu_);
      pending_.push_back(std::move(fn));
      if (running_) return;  // the running thread will get to it
      running_ = true;
    }
    for (;;) {
      std::function<void()> next;
      {
        absl::MutexLock lock(&mu_);
        if (pending_.empty()) {
          running_ = false;
          return;
        }
        next = std::move(pending_.front());
        pending_.pop_front();
      }
      next();
    }
  }

 private:
  absl::Mutex mu_;
  std::deque<std::function<void()>> pending_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_SERIAL_QUEUE_H_
