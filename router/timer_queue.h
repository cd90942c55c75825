// TimerQueue: runs functions at (or just after) the times they were given,
// one at a time on a thread of its own, earliest first. What it runs should
// only post work elsewhere (a RequestRun's SerialQueue), never block. When
// the queue is destroyed, the functions still pending run at once, with
// stopping() true, so that nothing waiting on one is left hanging.
// Thread-safe.
#ifndef PDSERVE_ROUTER_TIMER_QUEUE_H_
#define PDSERVE_ROUTER_TIMER_QUEUE_H_

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pdserve {

class TimerQueue {
 public:
  TimerQueue();
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` at `when` (at once when the queue is stopping).
  void RunAt(absl::Time when, std::function<void()> fn);
  // True once the queue is being destroyed.
  bool stopping() const;

 private:
  void Loop();

  mutable absl::Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> pending_
      ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // a new earliest entry
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_TIMER_QUEUE_H_
