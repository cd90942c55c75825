#include "router/timer_queue.h"

#include <utility>

#include "absl/time/clock.h"

namespace pdserve {

TimerQueue::TimerQueue() : thread_([this] { Loop(); }) {}

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void TimerQueue::RunAt(absl::Time when, std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      auto it = pending_.emplace(when, std::move(fn));
      if (it == pending_.begin()) wake_ = true;  // earlier than awaited
      return;
    }
  }
  fn();  // stopping: at once
}

bool TimerQueue::stopping() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

void TimerQueue::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time now = absl::Now();
    if (!pending_.empty() && (stop_ || pending_.begin()->first <= now)) {
      std::function<void()> fn = std::move(pending_.begin()->second);
      pending_.erase(pending_.begin());
      mu_.Unlock();
      fn();
      mu_.Lock();
      continue;
    }
    if (stop_) return;
    const absl::Time next =
        pending_.empty() ? absl::InfiniteFuture() : pending_.begin()->first;
    wake_ = false;
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](TimerQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                   q->mu_) { return q->stop_ || q->wake_; },
                              this),
                          next);
  }
}

}  // namespace pdserve
