// XXH3-64 compiled for AVX2 (this file alone is built with -mavx2; checksum.cc
// calls it only on CPUs that have AVX2). xxhash.h's inline implementation is
// the same code as libxxhash's, with its AVX2 accumulation loop: the values
// are identical (checksum_test).
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace pdserve::checksum_internal {

uint64_t Xxh3Avx2(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

}  // namespace pdserve::checksum_internal
