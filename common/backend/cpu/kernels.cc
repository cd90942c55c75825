#include "common/backend/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common/backend/cpu/packed_matrix.h"

namespace pdserve {
namespace {

// Everything up to the matching pop is compiled for AVX-512 and only runs
// when CpuHasAvx512() (lambdas included, hence the pragma).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")

// Loads 16 (or `n` < 16, zero-filled) values of a K/V row as f32.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 LoadKv(
    const char* p, DType dtype, int n) {
  const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1u);
  if (dtype == DType::kBF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_maskz_loadu_ps(mask, p);
}

// exp on 16 lanes (Cephes' single-precision polynomial, ~1 ulp); the same
// function for every row, so results never depend on the batch.
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

// Calls fn(j, row_pointer) for positions first..last in order, walking the
// block table once per block (no per-position division).
template <typename Fn>
inline void ForEachRow(const AttentionArgs& a, int kv, int64_t head_offset,
                       Fn&& fn) {
  const int bs = a.kv->layout().block_size;
  const int64_t stride = a.kv->row_bytes();
  int pos = a.first;
  while (pos <= a.last) {
    const int b = pos / bs;
    const int end = std::min(a.last, b * bs + bs - 1);
    const char* row =
        a.kv->BlockRow((*a.table)[b], a.layer, kv, pos - b * bs) + head_offset;
    for (; pos <= end; ++pos, row += stride) fn(pos - a.first, row);
  }
}

// kChunks = ceil(head_dim / 16) is a compile-time constant so that q and the
// output accumulators stay in zmm registers (with a run-time count the
// compiler kept them on the stack, and the P.V loop became a store-to-load
// chain per position). Same arithmetic, in the same order, for every count.
template <int kChunks>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void AttendAvx512(
    const AttentionArgs& a, const float* q, float* scores, float* out) {
  // Independent accumulator sets for P.V (positions j with j % kSets == u go
  // to set u, summed in a fixed order at the end): the result depends only on
  // (q, the rows, first, last), never on the batch or on chunking.
  constexpr int kSets = kChunks <= 4 ? 4 : (kChunks <= 8 ? 2 : 1);
  const DType dtype = a.kv->layout().dtype;
  const int esize = DTypeSize(dtype);
  const int64_t head_offset = int64_t{a.kv_head} * a.head_dim * esize;
  // V row = K row + this (same block, kv index 1).
  const int64_t v_delta = a.kv->layout().block_size * a.kv->row_bytes();
  int lanes[kChunks];
  __m512 qv[kChunks];
  for (int c = 0; c < kChunks; ++c) {
    lanes[c] = std::min(16, a.head_dim - 16 * c);
    qv[c] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << lanes[c]) - 1u),
                                  q + 16 * c);
  }
  const int count = a.last - a.first + 1;
  thread_local std::vector<const char*> rows;
  if (static_cast<int>(rows.size()) < count) rows.resize(count);
  ForEachRow(a, 0, head_offset, [&](int j, const char* k) {
    rows[j] = k;
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < kChunks; ++c) {
      acc = _mm512_fmadd_ps(qv[c], LoadKv(k + 16 * c * esize, dtype, lanes[c]),
                            acc);
    }
    scores[j] = _mm512_reduce_add_ps(acc) * a.scale;
  });
  // max is exact whatever the order; the sum of exponentials is accumulated
  // per lane and reduced once.
  __m512 mxv = _mm512_set1_ps(-INFINITY);
  for (int j = 0; j < count; j += 16) {
    const int n = std::min(16, count - j);
    const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
    mxv = _mm512_mask_max_ps(mxv, m, mxv, _mm512_maskz_loadu_ps(m, scores + j));
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mxv));
  __m512 sumv = _mm512_setzero_ps();
  for (int j = 0; j < count; j += 16) {
    const int n = std::min(16, count - j);
    const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
    const __m512 e =
        Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + j), mx));
    _mm512_mask_storeu_ps(scores + j, m, e);
    sumv = _mm512_mask_add_ps(sumv, m, sumv, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sumv));
  __m512 ov[kSets][kChunks];
  for (int u = 0; u < kSets; ++u) {
    for (int c = 0; c < kChunks; ++c) ov[u][c] = _mm512_setzero_ps();
  }
  int j = 0;
  for (; j + kSets <= count; j += kSets) {
    for (int u = 0; u < kSets; ++u) {
      const __m512 p = _mm512_mul_ps(_mm512_set1_ps(scores[j + u]), inv);
      const char* v = rows[j + u] + v_delta;
      for (int c = 0; c < kChunks; ++c) {
        ov[u][c] = _mm512_fmadd_ps(
            p, LoadKv(v + 16 * c * esize, dtype, lanes[c]), ov[u][c]);
      }
    }
  }
  for (; j < count; ++j) {
    const __m512 p = _mm512_mul_ps(_mm512_set1_ps(scores[j]), inv);
    const char* v = rows[j] + v_delta;
    for (int c = 0; c < kChunks; ++c) {
      ov[0][c] = _mm512_fmadd_ps(p, LoadKv(v + 16 * c * esize, dtype, lanes[c]),
                                 ov[0][c]);
    }
  }
  for (int c = 0; c < kChunks; ++c) {
    __m512 total = ov[0][c];
    for (int u = 1; u < kSets; ++u) total = _mm512_add_ps(total, ov[u][c]);
    _mm512_mask_storeu_ps(out + 16 * c,
                          static_cast<__mmask16>((1u << lanes[c]) - 1u), total);
  }
}

template <int... kChunks>
void AttendAvx512Dispatch(std::integer_sequence<int, kChunks...>,
                          const AttentionArgs& a, const float* q, float* scores,
                          float* out) {
  const int chunks = (a.head_dim + 15) / 16;
  ((chunks == kChunks + 1 ? AttendAvx512<kChunks + 1>(a, q, scores, out)
                          : void()),
   ...);
}

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

float LoadKvScalar(const char* row, DType dtype, int i) {
  if (dtype == DType::kBF16) {
    uint16_t v;
    std::memcpy(&v, row + 2 * i, 2);
    return Bf16ToF32(v);
  }
  float f;
  std::memcpy(&f, row + 4 * i, 4);
  return f;
}

void AttendScalar(const AttentionArgs& a, const float* q, float* scores,
                  float* out) {
  const DType dtype = a.kv->layout().dtype;
  const int64_t head_offset =
      int64_t{a.kv_head} * a.head_dim * DTypeSize(dtype);
  const int count = a.last - a.first + 1;
  float max_score = -INFINITY;
  for (int j = 0; j < count; ++j) {
    const char* k =
        a.kv->KeyRowAt(*a.table, a.layer, a.first + j) + head_offset;
    float s = 0.0f;
    for (int d = 0; d < a.head_dim; ++d) s += q[d] * LoadKvScalar(k, dtype, d);
    scores[j] = s * a.scale;
    max_score = std::max(max_score, scores[j]);
  }
  float sum = 0.0f;
  for (int j = 0; j < count; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < a.head_dim; ++d) out[d] = 0.0f;
  for (int j = 0; j < count; ++j) {
    const char* v =
        a.kv->ValueRowAt(*a.table, a.layer, a.first + j) + head_offset;
    const float p = scores[j] * inv;
    for (int d = 0; d < a.head_dim; ++d)
      out[d] += p * LoadKvScalar(v, dtype, d);
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
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.0f + std::exp(-g))) * up[i];
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

void AttendHead(const AttentionArgs& args, const float* q, float* scores,
                float* out) {
  if (CpuHasAvx512() && args.head_dim <= 256) {
    AttendAvx512Dispatch(std::make_integer_sequence<int, 16>(), args, q, scores,
                         out);
  } else {
    AttendScalar(args, q, scores, out);
  }
}

}  // namespace pdserve
