#include "common/util/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace pdserve {

bool HugePagesWanted() {
  static const bool wanted = [] {
    const char* env = std::getenv("PDSERVE_HUGE_PAGES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return wanted;
}

bool KernelHasHugePages() {
  static const bool has = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode;
    std::getline(f, mode);
    return !mode.empty() && mode.find("[never]") == std::string::npos;
  }();
  return has;
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

void* MapForStreaming(int64_t bytes) {
  constexpr int64_t kSmallPageBytes = 4096;
  const int64_t slack = kHugePageBytes;
  void* mapped = mmap(nullptr, bytes + slack, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapped == MAP_FAILED) return nullptr;
  // Unmap the slack around the aligned range (whole pages: its last page
  // stays, and munmap(p, bytes) rounds its length up to it).
  char* const start = static_cast<char*>(mapped);
  char* const base =
      start + (slack - reinterpret_cast<uintptr_t>(start) % slack) % slack;
  char* const end = start + bytes + slack;
  char* const kept_end =
      base + (bytes + kSmallPageBytes - 1) / kSmallPageBytes * kSmallPageBytes;
  if (base > start) munmap(start, base - start);
  if (end > kept_end) munmap(kept_end, end - kept_end);
  AdviseHugePages(base, bytes);
  return base;
}

void Prefault(void* p, int64_t bytes) {
  if (p == nullptr || bytes <= 0) return;
  if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
  // Kernels before 5.14 do not know MADV_POPULATE_WRITE.
  volatile char* const c = static_cast<char*>(p);
  for (int64_t i = 0; i < bytes; i += 4096) c[i] = 0;
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
