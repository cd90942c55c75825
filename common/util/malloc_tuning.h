// Heap tuning for processes that move the KV cache: multi-MiB buffers (KV
// chunks, gRPC messages) are allocated and freed per chunk, and glibc's
// default serves each from a fresh mmap whose pages fault in one by one
// (measured: page faults were the largest cost of a KV push; see
// docs/performance.md "KV transfer"). Call once at process start, before
// threads; not thread-safe.
#ifndef PDSERVE_COMMON_UTIL_MALLOC_TUNING_H_
#define PDSERVE_COMMON_UTIL_MALLOC_TUNING_H_

namespace pdserve {

// Serves allocations below 256 MiB from the heap and keeps up to 1 GiB of
// freed heap for reuse instead of returning it to the kernel at once, so the
// pages of a freed KV chunk are reused by the next one. Memory stays bounded
// by the process's peak use.
void TuneMallocForLargeBuffers();

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_MALLOC_TUNING_H_
