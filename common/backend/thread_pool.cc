#include "common/backend/thread_pool.h"

#include <immintrin.h>

namespace pdserve {
namespace {
constexpr int kSpinIterations = 4000;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::thread::hardware_concurrency());
  }
  num_threads_ = num_threads < 1 ? 1 : num_threads;
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { Worker(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunRange(int index) {
  const int64_t begin = n_ * index / num_threads_;
  const int64_t end = n_ * (index + 1) / num_threads_;
  if (begin < end) (*fn_)(begin, end, index);
}

void ThreadPool::Worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpinIterations &&
                    generation_.load(std::memory_order_acquire) == seen;
         ++i) {
      _mm_pause();
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] {
        return generation_.load(std::memory_order_acquire) != seen;
      });
    }
    seen = generation_.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    RunRange(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const RangeFn& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  fn_ = &fn;
  n_ = n;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  RunRange(0);
  for (int i = 0;
       i < kSpinIterations && pending_.load(std::memory_order_acquire) != 0;
       ++i) {
    _mm_pause();
  }
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(
        lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

}  // namespace pdserve
