#include "common/util/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pdserve {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2"))) void StreamingCopyAvx2(char* d, const char* s,
                                                       size_t size) {
  size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  if (head > size) head = size;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  size -= head;
  const size_t body = size & ~size_t{127};
  for (size_t i = 0; i < body; i += 128) {
    const __m256i a =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  std::memcpy(d + body, s + body, size - body);
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

}  // namespace

void StreamingCopyUnfenced(void* dst, const void* src, size_t size) {
#if defined(__x86_64__)
  if (HasAvx2()) {
    StreamingCopyAvx2(static_cast<char*>(dst), static_cast<const char*>(src),
                      size);
    return;
  }
#endif
  std::memcpy(dst, src, size);
}

void StreamingFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

void StreamingCopy(void* dst, const void* src, size_t size) {
  StreamingCopyUnfenced(dst, src, size);
  StreamingFence();
}

}  // namespace pdserve
