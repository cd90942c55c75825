// XXH3-64 checksums of large buffers (KV chunks): the same values as
// libxxhash's XXH3_64bits, computed with AVX2 where the CPU has it. Debian
// builds libxxhash for baseline x86-64 (SSE2); its AVX2 code path hashes a 4
// MiB chunk 1.6x (from memory) to 2.5x (from cache) faster on the
// development machine (docs/performance.md, "KV transfer"). Thread-safe.
#ifndef PDSERVE_COMMON_UTIL_CHECKSUM_H_
#define PDSERVE_COMMON_UTIL_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace pdserve {

// XXH3_64bits(data, size) (seed 0).
uint64_t Xxh3(const void* data, size_t size);

// Which implementation Xxh3 uses on this CPU: "avx2" or "sse2" (libxxhash).
const char* Xxh3Implementation();

namespace checksum_internal {
// libxxhash's own (baseline) implementation, and the AVX2 one (nullptr when
// not compiled in); exposed for the tests that compare them.
uint64_t Xxh3Baseline(const void* data, size_t size);
extern uint64_t (*const kXxh3Avx2)(const void* data, size_t size);
}  // namespace checksum_internal

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_CHECKSUM_H_
