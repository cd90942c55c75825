// Heap buffers for what the CPU kernels stream: 64-byte aligned, on huge
// pages from 2 MiB up (common/util/huge_pages.h), and weight matrices
// packed into shared huge-page slabs so that small ones get huge pages too.
// Thread-safe.
#ifndef PDSERVE_COMMON_BACKEND_CPU_ALIGNED_BUFFER_H_
#define PDSERVE_COMMON_BACKEND_CPU_ALIGNED_BUFFER_H_

#include <cstdint>
#include <memory>

namespace pdserve {

// 64-byte aligned heap buffer; from 2 MiB up on huge pages
// (common/util/huge_pages.h), since the kernels stream it. One from
// AllocateWeights may instead sit in a shared slab (`slab` set), which is
// freed with its last buffer.
struct AlignedFree {
  std::shared_ptr<char> slab;
  void operator()(void* p) const;
};
using AlignedBuffer = std::unique_ptr<char[], AlignedFree>;
AlignedBuffer AllocateAligned(int64_t bytes);
// A weight matrix's buffer (4 KiB aligned): matrices under kWeightSlabBytes
// / 2 are packed one after another into slabs of kWeightSlabBytes on huge
// pages, so that small matrices (a 768 x 768 bf16 projection is 1.2 MiB)
// get huge pages too; larger ones come from AllocateAligned. Thread-safe.
inline constexpr int64_t kWeightSlabBytes = int64_t{32} << 20;
AlignedBuffer AllocateWeights(int64_t bytes);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_ALIGNED_BUFFER_H_
