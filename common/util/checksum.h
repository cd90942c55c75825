// XXH3-64 checksums of large buffers (KV chunks): the same values as
// libxxhash's XXH3_64bits, computed with AVX2 where the CPU has it. Debian
// builds libxxhash for baseline x86-64 (SSE2); its AVX2 code path hashes a 4
// MiB chunk 1.6x (from memory) to 2.5x (from cache) faster on the
// development machine (docs/performance.md, "KV transfer"). Thread-safe.
#ifndef PDSERVE_COMMON_UTIL_CHECKSUM_H_
#define PDSERVE_COMMON_UTIL_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "common/util/streaming_copy.h"

namespace pdserve {

// XXH3_64bits(data, size) (seed 0).
uint64_t Xxh3(const void* data, size_t size);

// Incremental XXH3-64: Update over consecutive pieces, then Digest, gives
// Xxh3 of their concatenation. For hashing bytes while they are being copied
// (KV export and import), piece by piece while each is in cache, instead of
// in a pass of its own. Same implementation choice as Xxh3. Not thread-safe.
class Xxh3Stream {
 public:
  Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(const void* data, size_t size);
  uint64_t Digest() const;
  // Room for libxxhash's XXH3_state_t (576 bytes in 0.8; checked at
  // compile time).
  static constexpr size_t kStateBytes = 640;

 private:
  alignas(64) unsigned char state_[kStateBytes];
};

// Copies `size` bytes from `src` to `dst` (not overlapping) and returns
// their Xxh3, piece by piece: with Stores::kCached each piece is hashed
// right after its copy (from cache); with kStreaming (streaming_copy.h)
// each piece is hashed from src and then copied past the cache.
uint64_t CopyWithXxh3(void* dst, const void* src, size_t size,
                      Stores stores = Stores::kCached);

// Which implementation Xxh3 uses on this CPU: "avx2" or "sse2" (libxxhash).
const char* Xxh3Implementation();

namespace checksum_internal {
// libxxhash's own (baseline) implementation, and the AVX2 one (nullptr when
// not compiled in); exposed for the tests that compare them.
uint64_t Xxh3Baseline(const void* data, size_t size);
extern uint64_t (*const kXxh3Avx2)(const void* data, size_t size);
// The incremental functions of one implementation (state: Xxh3Stream's).
struct Xxh3StreamFns {
  void (*reset)(void* state);
  void (*update)(void* state, const void* data, size_t size);
  uint64_t (*digest)(const void* state);
};
extern const Xxh3StreamFns kXxh3StreamBaseline;
extern const Xxh3StreamFns* const kXxh3StreamAvx2;  // nullptr: not built
}  // namespace checksum_internal

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_CHECKSUM_H_
