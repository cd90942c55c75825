#include "common/util/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace pdserve {

bool HugePagesWanted() {
  static const bool wanted = [] {
    const char* env = std::getenv("PDSERVE_HUGE_PAGES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return wanted;
}

void AdviseHugePages(void* p, int64_t bytes) {
  if (!HugePagesWanted() || p == nullptr) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first =
      (begin + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t last = (begin + bytes) / kHugePageBytes * kHugePageBytes;
  if (last <= first) return;
  // Best effort: a kernel without transparent huge pages answers EINVAL and
  // the buffer keeps its 4 KiB pages.
  madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}

void* AllocateForStreaming(int64_t bytes) {
  const size_t rounded = (std::max<int64_t>(bytes, 64) + 63) / 64 * 64;
  const size_t alignment =
      HugePagesWanted() && bytes >= kHugePageBytes ? kHugePageBytes : 64;
  void* p = nullptr;
  if (posix_memalign(&p, alignment, rounded) != 0) return nullptr;
  if (alignment == kHugePageBytes) AdviseHugePages(p, bytes);
  return p;
}

}  // namespace pdserve
