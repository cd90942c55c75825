// XXH3-64 compiled for AVX2 (this file alone is built with -mavx2; checksum.cc
// calls it only on CPUs that have AVX2). xxhash.h's inline implementation is
// the same code as libxxhash's, with its AVX2 accumulation loop: the values
// are identical (checksum_test).
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

#include "common/util/checksum.h"

namespace pdserve::checksum_internal {

uint64_t Xxh3Avx2(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

static_assert(sizeof(XXH3_state_t) <= Xxh3Stream::kStateBytes &&
              alignof(XXH3_state_t) <= 64);

namespace {
void ResetAvx2(void* state) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state));
}
void UpdateAvx2(void* state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
uint64_t DigestAvx2(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}
}  // namespace

extern const Xxh3StreamFns kXxh3StreamAvx2Impl{&ResetAvx2, &UpdateAvx2,
                                               &DigestAvx2};

}  // namespace pdserve::checksum_internal
