#include "common/util/checksum.h"

#include <xxhash.h>

namespace pdserve {
namespace checksum_internal {

#ifdef PDSERVE_XXH3_AVX2
uint64_t Xxh3Avx2(const void* data, size_t size);  // checksum_avx2.cc
uint64_t (*const kXxh3Avx2)(const void*, size_t) = &Xxh3Avx2;
#else
uint64_t (*const kXxh3Avx2)(const void*, size_t) = nullptr;
#endif

uint64_t Xxh3Baseline(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

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

}  // namespace

uint64_t Xxh3(const void* data, size_t size) { return Chosen()(data, size); }

const char* Xxh3Implementation() {
  return Chosen() == &checksum_internal::Xxh3Baseline ? "sse2" : "avx2";
}

}  // namespace pdserve
