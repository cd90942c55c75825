// Chooses, by measurement, how a producer writes a buffer that a consumer
// on another core reads right after (a KV chunk a prefill worker leaves in
// place for the decode worker): ordinary stores, which hand the bytes over
// through the shared cache, unless they have recently been kMargin times
// slower per byte than non-temporal ones. On the 2-core VM this was built
// on, the cache handoff is the fastest way most of the time and, in phases
// lasting seconds, 3-4x slower than memory, while non-temporal stores
// hold a steady rate throughout (docs/performance.md, "The in-place
// handoff's slow phases"). Every kProbeEvery-th choice takes the other
// kind, so both estimates follow the machine. Thread-safe.
#ifndef PDSERVE_COMMON_UTIL_ADAPTIVE_STORES_H_
#define PDSERVE_COMMON_UTIL_ADAPTIVE_STORES_H_

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/util/streaming_copy.h"

namespace pdserve {

class AdaptiveStores {
 public:
  // Non-temporal stores take over when ordinary ones are this many times
  // slower per byte (below it, the consumer's cache-hot read wins: a push
  // from streamed chunks measured 1.3x slower than from cached ones at a
  // seal only 1.2x slower).
  static constexpr double kMargin = 1.5;
  static constexpr int kProbeEvery = 16;
  // Fills smaller than this are not measured (too short to time).
  static constexpr int64_t kMinMeasuredBytes = int64_t{256} << 10;

  // Adaptive unless PDSERVE_KV_EXPORT_STORES=cached or =streaming pins the
  // choice (for A/B runs).
  AdaptiveStores();
  // `pinned`: always that kind; nullopt: adaptive.
  explicit AdaptiveStores(std::optional<Stores> pinned) : pinned_(pinned) {}

  Stores Choose();
  // A fill of `bytes` with `used` took `seconds`.
  void Report(Stores used, int64_t bytes, double seconds);

  // Seconds per GB of each kind (exponentially weighted); 0 when not yet
  // measured.
  double SecondsPerGb(Stores kind);

 private:
  static int Index(Stores s) { return s == Stores::kStreaming ? 1 : 0; }

  const std::optional<Stores> pinned_;
  absl::Mutex mu_;
  double seconds_per_byte_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  int64_t choices_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_ADAPTIVE_STORES_H_
