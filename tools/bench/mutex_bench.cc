// mutex_bench: what Abseil's lock-order (deadlock) detection costs, the
// reason `pdserve` turns it off at start (common/util/mutex_debugging.h).
// Debian's libabsl is built with it on, and every Mutex::Lock then updates a
// process-wide lock graph under one spin lock. Each round times uncontended
// lock/unlock pairs on private mutexes (one per thread) with detection off
// and on, alternating, and prints ns per lock; the summary is the median of
// the per-round ratios on / off.
//
//   build/tools/mutex_bench [--threads=2] [--rounds=5] [--locks=2000000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace {

int FlagValue(int argc, char** argv, const char* name, int fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoi(argv[i] + prefix.size());
    }
  }
  return fallback;
}

// Nanoseconds per lock/unlock pair, `threads` threads each locking its own
// mutex `locks` times.
double NsPerLock(int threads, int locks) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([locks] {
      absl::Mutex mu;
      for (int i = 0; i < locks; ++i) absl::MutexLock lock(&mu);
    });
  }
  for (std::thread& w : workers) w.join();
  const std::chrono::duration<double, std::nano> elapsed =
      std::chrono::steady_clock::now() - start;
  return elapsed.count() / locks;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = std::max(1, FlagValue(argc, argv, "threads", 2));
  const int rounds = std::max(1, FlagValue(argc, argv, "rounds", 5));
  const int locks = std::max(1000, FlagValue(argc, argv, "locks", 2000000));
  std::vector<double> off, on, ratio;
  for (int r = 0; r < rounds; ++r) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    off.push_back(NsPerLock(threads, locks));
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
    on.push_back(NsPerLock(threads, locks));
    ratio.push_back(on.back() / off.back());
    std::printf(
        "round %d: %d threads, ns per lock: detection off %.1f, on %.1f\n",
        r + 1, threads, off.back(), on.back());
  }
  std::printf("median ns per lock: off %.1f, on %.1f; on/off %.1fx\n",
              Median(off), Median(on), Median(ratio));
  return 0;
}
