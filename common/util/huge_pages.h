// Transparent huge pages for long-lived buffers that are streamed (packed
// weights, the KV pool, UCX's KV buffers): one TLB entry per 2 MiB instead of
// per 4 KiB, measured 1.14-1.18x faster decode attention at context 2048 and
// 3-5% faster weight streaming (docs/performance.md, "Huge pages").
// PDSERVE_HUGE_PAGES=0 turns them off. Thread-safe.
#ifndef PDSERVE_COMMON_UTIL_HUGE_PAGES_H_
#define PDSERVE_COMMON_UTIL_HUGE_PAGES_H_

#include <cstdint>

namespace pdserve {

inline constexpr int64_t kHugePageBytes = int64_t{2} << 20;

// Whether buffers ask for huge pages: yes unless PDSERVE_HUGE_PAGES=0 (read
// once per process).
bool HugePagesWanted();

// Whether the kernel hands out transparent huge pages at all
// (/sys/kernel/mm/transparent_hugepage/enabled is not [never]; read once).
bool KernelHasHugePages();

// Asks the kernel (madvise MADV_HUGEPAGE) to back the whole 2 MiB pages
// inside [p, p + bytes) with huge pages; bytes outside them keep 4 KiB
// pages, so nothing becomes resident that would not have. A no-op when not
// wanted, and harmless where the kernel has transparent huge pages off.
void AdviseHugePages(void* p, int64_t bytes);

// An anonymous private mapping of `bytes` (rounded up to 4 KiB pages;
// MAP_NORESERVE: pages become resident when first touched) that starts on a
// 2 MiB boundary and is advised as above; nullptr when mmap fails. Release
// it with munmap(p, bytes).
void* MapForStreaming(int64_t bytes);

// Makes [p, p + bytes) of such a mapping resident now (madvise
// MADV_POPULATE_WRITE, else a write per 4 KiB page), so that first touches
// do not zero 2 MiB pages in the middle of a request.
void Prefault(void* p, int64_t bytes);

// A 64-byte aligned heap buffer of `bytes` (free with std::free). From
// 2 MiB up it starts on a 2 MiB boundary and its whole 2 MiB pages are
// advised as above.
void* AllocateForStreaming(int64_t bytes);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_HUGE_PAGES_H_
