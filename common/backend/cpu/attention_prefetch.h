// The CPU attention kernels' software prefetch (attention.cc): byte ranges
// of the next context partition's K and V tiles, prefetched a few cache
// lines at a time through the current partition's work. Prefetches never
// change a bit.
#ifndef PDSERVE_COMMON_BACKEND_CPU_ATTENTION_PREFETCH_H_
#define PDSERVE_COMMON_BACKEND_CPU_ATTENTION_PREFETCH_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace pdserve::cpu_internal {

// Bytes [from, from + bytes) that a partition's work reads.
struct PrefetchRange {
  const char* from;
  int64_t bytes;
};

// Whether the drip prefetches into L2 (else L1): attention_bench (context
// 2048, bf16 and f32) measured L1 1.17x faster than L2 on an AMD Zen 5 and
// L2 1.17-1.2x faster than L1 on an Intel Xeon (Sapphire Rapids class), so
// L2 on Intel, L1 elsewhere; PDSERVE_ATTENTION_PREFETCH=l1|l2 forces one.
// Decided once per process; thread-safe.
bool AttentionPrefetchToL2();

// Software prefetch of the next partition's K and V (32 KiB bf16, 64 KiB
// f32 per head; into L1 or L2 by AttentionPrefetchToL2), dripped a few cache
// lines at a time through the current partition's work: issued as one burst
// before the work, the prefetches overflow the miss buffers (attention_bench
// measured 1.6-1.8x slower than dripped); a block whose id does not follow
// the previous one's starts a new 4-8 KiB stream (its K and V tiles) that
// the hardware prefetchers find late. One per computing thread (not
// thread-safe); Reset before each partition's work.
class PrefetchDrip {
 public:
  PrefetchDrip() : to_l2_(AttentionPrefetchToL2()) {}
  // The ranges to prefetch (kept by pointer) over `steps` calls of Step
  // (0: none until Finish).
  void Reset(const PrefetchRange* ranges, int n, int64_t steps) {
    ranges_ = ranges;
    n_ = n;
    r_ = 0;
    at_ = n > 0 ? ranges[0].from : nullptr;
    end_ = n > 0 ? ranges[0].from + ranges[0].bytes : nullptr;
    int64_t lines = 0;
    for (int i = 0; i < n; ++i) lines += (ranges[i].bytes + 63) / 64;
    per_step_ = steps > 0 ? static_cast<int>((lines + steps - 1) / steps) : 0;
  }
  // The next per_step_ lines: a straight run of prefetches inside the
  // current range (the common case: one range per partition), the range
  // switch and the hint choice outside the inner loop.
  void Step() {
    int left = per_step_;
    while (left > 0 && at_ != nullptr) {
      const int room = static_cast<int>((end_ - at_ + 63) / 64);
      if (room <= 0) {  // an empty range (none is built; never spin on one)
        NextRange();
        continue;
      }
      const int k = std::min(left, room);
      if (to_l2_) {
        for (int i = 0; i < k; ++i) _mm_prefetch(at_ + 64 * i, _MM_HINT_T1);
      } else {
        for (int i = 0; i < k; ++i) _mm_prefetch(at_ + 64 * i, _MM_HINT_T0);
      }
      at_ += 64 * k;
      left -= k;
      if (at_ >= end_) NextRange();
    }
  }
  // Whatever is left, at once.
  void Finish() {
    per_step_ = 1 << 30;
    Step();
  }

 private:
  void NextRange() {
    if (++r_ < n_) {
      at_ = ranges_[r_].from;
      end_ = at_ + ranges_[r_].bytes;
    } else {
      at_ = nullptr;
    }
  }

  const bool to_l2_;
  const PrefetchRange* ranges_ = nullptr;
  int n_ = 0, r_ = 0, per_step_ = 0;
  const char* at_ = nullptr;
  const char* end_ = nullptr;
};

}  // namespace pdserve::cpu_internal

#endif  // PDSERVE_COMMON_BACKEND_CPU_ATTENTION_PREFETCH_H_
