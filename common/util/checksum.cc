#include "common/util/checksum.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t's definition
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace pdserve {
namespace checksum_internal {

#ifdef PDSERVE_XXH3_AVX2
uint64_t Xxh3Avx2(const void* data, size_t size);  // checksum_avx2.cc
extern const Xxh3StreamFns kXxh3StreamAvx2Impl;    // checksum_avx2.cc
uint64_t (*const kXxh3Avx2)(const void*, size_t) = &Xxh3Avx2;
const Xxh3StreamFns* const kXxh3StreamAvx2 = &kXxh3StreamAvx2Impl;
#else
uint64_t (*const kXxh3Avx2)(const void*, size_t) = nullptr;
const Xxh3StreamFns* const kXxh3StreamAvx2 = nullptr;
#endif

uint64_t Xxh3Baseline(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

static_assert(sizeof(XXH3_state_t) <= Xxh3Stream::kStateBytes &&
              alignof(XXH3_state_t) <= 64);

namespace {
void ResetBaseline(void* state) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state));
}
void UpdateBaseline(void* state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
uint64_t DigestBaseline(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}
}  // namespace

const Xxh3StreamFns kXxh3StreamBaseline{&ResetBaseline, &UpdateBaseline,
                                        &DigestBaseline};

}  // namespace checksum_internal

namespace {

using Xxh3Fn = uint64_t (*)(const void*, size_t);

Xxh3Fn Choose() {
#if defined(PDSERVE_XXH3_AVX2) && (defined(__x86_64__) || defined(__i386__))
  if (__builtin_cpu_supports("avx2")) return checksum_internal::kXxh3Avx2;
#endif
  return &checksum_internal::Xxh3Baseline;
}

Xxh3Fn Chosen() {
  static const Xxh3Fn fn = Choose();
  return fn;
}

const checksum_internal::Xxh3StreamFns& StreamFns() {
  static const checksum_internal::Xxh3StreamFns* const fns =
      Chosen() == &checksum_internal::Xxh3Baseline
          ? &checksum_internal::kXxh3StreamBaseline
          : checksum_internal::kXxh3StreamAvx2;
  return *fns;
}

}  // namespace

uint64_t Xxh3(const void* data, size_t size) { return Chosen()(data, size); }

Xxh3Stream::Xxh3Stream() { StreamFns().reset(state_); }

void Xxh3Stream::Update(const void* data, size_t size) {
  StreamFns().update(state_, data, size);
}

uint64_t Xxh3Stream::Digest() const { return StreamFns().digest(state_); }

uint64_t CopyWithXxh3(void* dst, const void* src, size_t size, Stores stores) {
  // Pieces small enough to be hashed from L1 right after their copy.
  constexpr size_t kPiece = size_t{16} << 10;
  Xxh3Stream hash;
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (stores == Stores::kStreaming) {
    // Up to dst's first cache line boundary alone, so that every piece
    // after it starts on one: a partial line takes ordinary stores, whose
    // read of the line from memory would otherwise stall every piece.
    const size_t head = std::min(
        size, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & size_t{63});
    hash.Update(s, head);
    std::memcpy(d, s, head);
    for (size_t at = head; at < size; at += kPiece) {
      const size_t n = std::min(kPiece, size - at);
      hash.Update(s + at, n);  // src stays in L1 for the copy
      StreamingCopyUnfenced(d + at, s + at, n);
    }
    StreamingFence();
    return hash.Digest();
  }
  for (size_t at = 0; at < size; at += kPiece) {
    const size_t n = std::min(kPiece, size - at);
    std::memcpy(d + at, s + at, n);
    hash.Update(d + at, n);
  }
  return hash.Digest();
}

const char* Xxh3Implementation() {
  return Chosen() == &checksum_internal::Xxh3Baseline ? "sse2" : "avx2";
}

}  // namespace pdserve
