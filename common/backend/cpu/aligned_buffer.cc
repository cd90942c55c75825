#include "common/backend/cpu/aligned_buffer.h"

#include <algorithm>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/util/huge_pages.h"

namespace pdserve {
namespace {

// The weight slab being filled; held weakly, so that a slab whose matrices
// are all gone is freed even while it is the current one.
struct WeightSlabs {
  absl::Mutex mu;
  std::weak_ptr<char> current ABSL_GUARDED_BY(mu);
  int64_t used ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace

void AlignedFree::operator()(void* p) const {
  if (slab == nullptr) std::free(p);  // else the slab goes with its last user
}

AlignedBuffer AllocateAligned(int64_t bytes) {
  return AlignedBuffer(static_cast<char*>(AllocateForStreaming(bytes)));
}

AlignedBuffer AllocateWeights(int64_t bytes) {
  constexpr int64_t kAlign = 4096;
  if (bytes >= kWeightSlabBytes / 2) return AllocateAligned(bytes);
  const int64_t rounded =
      (std::max<int64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  static WeightSlabs* const slabs = new WeightSlabs();  // never destroyed
  absl::MutexLock lock(&slabs->mu);
  std::shared_ptr<char> slab = slabs->current.lock();
  if (slab == nullptr || slabs->used + rounded > kWeightSlabBytes) {
    char* const p = static_cast<char*>(AllocateForStreaming(kWeightSlabBytes));
    if (p == nullptr) return AlignedBuffer();
    slab = std::shared_ptr<char>(p, [](char* q) { std::free(q); });
    slabs->current = slab;
    slabs->used = 0;
  }
  char* const at = slab.get() + slabs->used;
  slabs->used += rounded;
  return AlignedBuffer(at, AlignedFree{std::move(slab)});
}

}  // namespace pdserve
