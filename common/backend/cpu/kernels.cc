#include "common/backend/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "common/backend/cpu/packed_matrix.h"
#include "common/backend/cpu/simd_exp.h"

// GCC 12 reports its own intrinsics' `__m512 __Y = __Y;` idiom (masked
// loads, conversions, reductions) as (maybe-)uninitialized once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve {
namespace {

// Everything up to the matching pop is compiled for AVX-512 and only runs
// when CpuHasAvx512() (lambdas included, hence the pragma).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")

__attribute__((target("avx512f,fma"))) void SiluMulAvx512(const float* gate,
                                                          const float* up,
                                                          int n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m =
        static_cast<__mmask16>((1u << std::min(16, n - i)) - 1u);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = Exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(
        out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

#pragma GCC pop_options

__attribute__((target("avx2,fma"))) void SiluMulAvx2(const float* gate,
                                                     const float* up, int n,
                                                     float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.0f + ExpScalar(0.0f - g))) * up[i];
  }
}

}  // namespace

void RmsNorm(const float* x, const float* weight, int n, float eps,
             float* out) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float variance = static_cast<float>(sum / n);
  const float r = 1.0f / std::sqrt(variance + eps);
  for (int i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * r);
}

void RopeAngles(const std::vector<float>& inv_freq, int64_t position,
                float* cos_out, float* sin_out) {
  const float pos = static_cast<float>(position);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float angle = pos * inv_freq[i];  // float32, as transformers
    cos_out[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    sin_out[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
}

void ApplyRope(float* x, int num_heads, int head_dim, const float* cos,
               const float* sin) {
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + h * head_dim;
    for (int i = 0; i < half; ++i) {
      const float x1 = v[i], x2 = v[i + half];
      const float a = x1 * cos[i];
      const float b = -x2 * sin[i];
      const float c = x2 * cos[i];
      const float d = x1 * sin[i];
      v[i] = a + b;
      v[i + half] = c + d;
    }
  }
}

void SiluMul(const float* gate, const float* up, int n, float* out) {
  if (CpuHasAvx512()) {
    SiluMulAvx512(gate, up, n, out);
    return;
  }
  if (CpuHasAvx2()) {
    SiluMulAvx2(gate, up, n, out);
    return;
  }
  // The same steps on one float (same bits).
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.0f + ExpScalar(0.0f - g))) * up[i];
  }
}

void StoreRow(const float* src, int n, DType dtype, char* dst) {
  if (dtype == DType::kBF16) {
    for (int i = 0; i < n; ++i) {
      const uint16_t v = F32ToBf16(src[i]);
      std::memcpy(dst + 2 * i, &v, 2);
    }
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  }
}

}  // namespace pdserve
