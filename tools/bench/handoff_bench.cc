// handoff_bench: how fast one thread can hand bytes to another through a
// few rotating buffers, as a prefill worker hands KV chunks in place to a
// decode worker on the same host (DESIGN.md "Same host: D imports in place
// ..."): the producer copies 4 MiB pieces of a 256 MiB source into buffer
// k % N and runs at most 2 pieces ahead of the consumer, which copies each
// piece on into a 256 MiB destination. Each run prints the producer's GB/s
// for every pass over the source, with ordinary stores (cached) and with
// non-temporal ones (streaming), alternating, and the same copies without
// a consumer (alone) as the memory's own rate. On the VM this was written
// on, cached handoffs alternate between phases at 12-14 GB/s and phases at
// 3-5 GB/s lasting seconds, while streaming holds 9-12
// (docs/performance.md "The in-place handoff's slow phases").
//
//   build/tools/handoff_bench [--rounds=6] [--tenths=25] [--buffers=3]
//
// Threads: the producer on CPU 1, the consumer on CPU 0 (where there are
// two CPUs). Prints one line per run and a summary of medians.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/util/streaming_copy.h"
#include "tools/bench_stats.h"

namespace {

constexpr size_t kPiece = size_t{4} << 20;
constexpr size_t kTotal = size_t{256} << 20;
constexpr long kAhead = 2;  // pieces the producer may run ahead

void PinTo(int cpu) {
  if (static_cast<int>(std::thread::hardware_concurrency()) <= cpu) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// One run of `seconds`: the producer's GB/s per pass over the source.
std::vector<double> Run(int buffers, bool consumer, pdserve::Stores stores,
                        double seconds) {
  std::vector<char> src(kTotal), dst(kTotal);
  for (size_t i = 0; i < kTotal; i += 64) src[i] = static_cast<char>(i >> 6);
  std::vector<char> ring(static_cast<size_t>(buffers) * kPiece + 64);
  char* const base = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(ring.data()) + 63) & ~uintptr_t{63});
  std::memset(base, 0, static_cast<size_t>(buffers) * kPiece);
  std::atomic<long> produced{0}, consumed{0};
  std::atomic<bool> stop{false};
  std::thread reader;
  if (consumer) {
    reader = std::thread([&] {
      PinTo(0);
      long k = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (k >= produced.load(std::memory_order_acquire)) continue;
        std::memcpy(dst.data() + (k * kPiece) % kTotal,
                    base + (k % buffers) * kPiece, kPiece);
        consumed.store(++k, std::memory_order_release);
      }
    });
  }
  PinTo(1);
  std::vector<double> gbps;
  long k = 0;
  const double end = pdserve::MonotonicSeconds() + seconds;
  while (pdserve::MonotonicSeconds() < end) {
    const double start = pdserve::MonotonicSeconds();
    for (size_t at = 0; at < kTotal; at += kPiece) {
      while (consumer &&
             k - consumed.load(std::memory_order_acquire) >= kAhead) {
      }
      char* to = base + (k % buffers) * kPiece;
      if (stores == pdserve::Stores::kStreaming) {
        pdserve::StreamingCopy(to, src.data() + at, kPiece);
      } else {
        std::memcpy(to, src.data() + at, kPiece);
      }
      produced.store(++k, std::memory_order_release);
    }
    while (consumer && consumed.load(std::memory_order_acquire) < k) {
    }
    gbps.push_back(kTotal / (pdserve::MonotonicSeconds() - start) / 1e9);
  }
  stop = true;
  if (consumer) reader.join();
  return gbps;
}

int Flag(int argc, char** argv, const char* name, int fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoi(argv[i] + prefix.size());
    }
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "usage: handoff_bench [--rounds=6] [--tenths=25] [--buffers=3]\n"
          "  rounds: runs of each kind, alternating; tenths: seconds per run "
          "x 10; buffers: rotating 4 MiB buffers (the UCX push keeps about "
          "3)\n");
      return 0;
    }
  }
  const int rounds = Flag(argc, argv, "rounds", 6);
  const double seconds = Flag(argc, argv, "tenths", 25) / 10.0;
  const int buffers = Flag(argc, argv, "buffers", 3);
  if (rounds < 1 || seconds <= 0 || buffers < kAhead + 1) {
    std::fprintf(stderr,
                 "handoff_bench: --rounds and --tenths must be positive, "
                 "--buffers at least %ld\n",
                 kAhead + 1);
    return 1;
  }
  struct Kind {
    const char* name;
    bool consumer;
    pdserve::Stores stores;
    std::vector<double> medians, minima;
  };
  std::vector<Kind> kinds = {
      {"cached handoff", true, pdserve::Stores::kCached, {}, {}},
      {"streaming handoff", true, pdserve::Stores::kStreaming, {}, {}},
      {"cached alone", false, pdserve::Stores::kCached, {}, {}}};
  std::printf(
      "handoff_bench: %d buffers of 4 MiB, %ld ahead; GB/s per pass "
      "of 256 MiB (median, min over the run)\n",
      buffers, kAhead);
  for (int r = 0; r < rounds; ++r) {
    std::printf("round %d:", r + 1);
    for (Kind& kind : kinds) {
      std::vector<double> g = Run(buffers, kind.consumer, kind.stores, seconds);
      kind.medians.push_back(pdserve::Median(g));
      kind.minima.push_back(*std::min_element(g.begin(), g.end()));
      std::printf("  %s %.1f (min %.1f)", kind.name, kind.medians.back(),
                  kind.minima.back());
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  std::printf("median over the rounds:");
  for (const Kind& kind : kinds) {
    std::printf("  %s %.1f (lowest %.1f)", kind.name,
                pdserve::Median(kind.medians),
                *std::min_element(kind.minima.begin(), kind.minima.end()));
  }
  std::printf("\n");
  return 0;
}
