#include "common/util/adaptive_stores.h"

#include <cstdlib>
#include <cstring>

namespace pdserve {
namespace {

std::optional<Stores> PinnedFromEnvironment() {
  const char* v = std::getenv("PDSERVE_KV_EXPORT_STORES");
  if (v == nullptr) return std::nullopt;
  if (std::strcmp(v, "cached") == 0) return Stores::kCached;
  if (std::strcmp(v, "streaming") == 0) return Stores::kStreaming;
  return std::nullopt;
}

}  // namespace

AdaptiveStores::AdaptiveStores() : AdaptiveStores(PinnedFromEnvironment()) {}

Stores AdaptiveStores::Choose() {
  if (pinned_) return *pinned_;
  absl::MutexLock lock(&mu_);
  const double cached = seconds_per_byte_[Index(Stores::kCached)];
  const double streaming = seconds_per_byte_[Index(Stores::kStreaming)];
  // Unmeasured streaming counts as no better: ordinary stores until a
  // probe says otherwise.
  const Stores best = streaming > 0 && streaming * kMargin < cached
                          ? Stores::kStreaming
                          : Stores::kCached;
  if (++choices_ % kProbeEvery == 0) {
    return best == Stores::kCached ? Stores::kStreaming : Stores::kCached;
  }
  return best;
}

void AdaptiveStores::Report(Stores used, int64_t bytes, double seconds) {
  if (pinned_ || bytes < kMinMeasuredBytes || seconds <= 0) return;
  const double per_byte = seconds / static_cast<double>(bytes);
  absl::MutexLock lock(&mu_);
  double& estimate = seconds_per_byte_[Index(used)];
  // Half weight: a phase change shows within two or three chunks (a 4 MiB
  // chunk takes about 0.3 ms), and the kind only probed (one fill in
  // kProbeEvery) follows the machine from one probe to the next; a single
  // slow fill flips the choice at most until the next probe.
  estimate = estimate == 0 ? per_byte : 0.5 * estimate + 0.5 * per_byte;
}

double AdaptiveStores::SecondsPerGb(Stores kind) {
  absl::MutexLock lock(&mu_);
  return seconds_per_byte_[Index(kind)] * 1e9;
}

}  // namespace pdserve
