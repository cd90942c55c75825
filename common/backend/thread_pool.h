// A fixed pool of compute threads created once. ParallelFor splits [0, n)
// into one contiguous range per thread, a split that depends only on n and
// the pool size (never on timing), and the calling thread takes range 0.
// One caller at a time (the engine's driving thread); not reentrant.
#ifndef PDSERVE_COMMON_BACKEND_THREAD_POOL_H_
#define PDSERVE_COMMON_BACKEND_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pdserve {

class ThreadPool {
 public:
  // num_threads <= 0: one per online CPU.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }
  // fn(begin, end, thread_index) over contiguous ranges covering [0, n).
  using RangeFn = std::function<void(int64_t, int64_t, int)>;
  void ParallelFor(int64_t n, const RangeFn& fn);

 private:
  void Worker(int index);
  void RunRange(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;            // guarded by mu_
  const RangeFn* fn_ = nullptr;  // published by generation_
  int64_t n_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_THREAD_POOL_H_
