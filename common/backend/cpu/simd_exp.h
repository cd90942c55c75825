// exp for the CPU kernels (SiLU, softmax): Cephes' single-precision
// polynomial, ~1 ulp, on 16 lanes (AVX-512), 8 lanes (AVX2) or one float
// (ExpScalar, any CPU): the same operations in the same order, so the same
// bits for every row, lane and CPU; results never depend on the batch.
// Call Exp512 only when CpuHasAvx512(), Exp256 only when CpuHasAvx2().
#ifndef PDSERVE_COMMON_BACKEND_CPU_SIMD_EXP_H_
#define PDSERVE_COMMON_BACKEND_CPU_SIMD_EXP_H_

#include <immintrin.h>

#include <algorithm>
#include <cmath>

// GCC 12 reports its own intrinsics' `__m512 __Y = __Y;` idiom as
// (maybe-)uninitialized once inlined: silenced for this header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve {

__attribute__((target("avx512f,fma"))) inline __m512 Exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)),
                    _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r),
                      _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// Exp512's steps on 8 lanes. scalef(p, n) = p * 2^n rounded once: n is in
// [-126, 128] after the clamp, so 2^min(n, 127) is a normal float (one
// rounding) and a remaining factor 2 is exact or overflows as scalef does.
__attribute__((target("avx2,fma"))) inline __m256 Exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)),
                    _mm256_set1_ps(88.72283f));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r),
                      _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_min_epi32(ni, _mm256_set1_epi32(127));
  const __m256i n2 = _mm256_sub_epi32(ni, n1);  // 0 or 1
  const __m256 pow1 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  const __m256 pow2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, pow1), pow2);
}

// Exp512's steps on one float (std::fma is exact FMA on every CPU;
// std::nearbyint rounds half to even in the default rounding mode).
inline float ExpScalar(float x) {
  x = std::min(std::max(x, -87.33654f), 88.72283f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  return std::ldexp(p, static_cast<int>(n));
}

// One lane of Exp256 / Exp512 (tests).
__attribute__((target("avx2,fma"))) inline float TestOnlyExp256(float x) {
  return _mm256_cvtss_f32(Exp256(_mm256_set1_ps(x)));
}
__attribute__((target("avx512f,fma"))) inline float TestOnlyExp512(float x) {
  return _mm512_cvtss_f32(Exp512(_mm512_set1_ps(x)));
}

}  // namespace pdserve

#pragma GCC diagnostic pop

#endif  // PDSERVE_COMMON_BACKEND_CPU_SIMD_EXP_H_
