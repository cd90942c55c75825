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

// Softmax of scores[0, count) in place, returning 1 / sum of exponentials.
// max is exact whatever the order; the sum of exponentials is accumulated per
// lane (lane = j % 16) and reduced once.
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline float
SoftmaxExp(float* scores, int count) {
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
  return 1.0f / _mm512_reduce_add_ps(sumv);
}

// kChunks = ceil(head_dim / 16) and the tile size kTile are compile-time
// constants so that the queries and the output accumulators stay in zmm
// registers. A tile shares the K and V row loads between up to kTile queries
// of one sequence and kv head; each query's arithmetic is the same as alone:
// score_j = reduce_add(FMA chain over the 16-lane chunks of q * k_j) * scale;
// softmax as SoftmaxExp; out = FMA chain over j in increasing order of
// (p_j * inv_sum) * v_j. So a query's result depends only on (q, the rows,
// first, last), never on its tile-mates, the batch or chunking.
template <int kChunks, int kTile>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void AttendTileAvx512(
    const AttentionArgs& a, const AttentionQuery* qs) {
  const DType dtype = a.kv->layout().dtype;
  const int esize = DTypeSize(dtype);
  const int64_t head_offset = int64_t{a.kv_head} * a.head_dim * esize;
  // V row = K row + this (same block, kv index 1).
  const int64_t v_delta = a.kv->layout().block_size * a.kv->row_bytes();
  int lanes[kChunks];
  for (int c = 0; c < kChunks; ++c)
    lanes[c] = std::min(16, a.head_dim - 16 * c);
  __m512 qv[kTile][kChunks];
  int lo = qs[0].first, hi = qs[0].last;
  for (int g = 0; g < kTile; ++g) {
    lo = std::min(lo, qs[g].first);
    hi = std::max(hi, qs[g].last);
    for (int c = 0; c < kChunks; ++c) {
      qv[g][c] = _mm512_maskz_loadu_ps(
          static_cast<__mmask16>((1u << lanes[c]) - 1u), qs[g].q + 16 * c);
    }
  }
  AttentionArgs range = a;
  range.first = lo;
  range.last = hi;
  const int count = hi - lo + 1;
  thread_local std::vector<const char*> rows;
  if (static_cast<int>(rows.size()) < count) rows.resize(count);
  ForEachRow(range, 0, head_offset, [&](int i, const char* k) { rows[i] = k; });
  // The rows are scattered (one head's slice of each position's row), which
  // the hardware prefetchers do not follow: prefetch K kAhead positions ahead
  // into L1 and V into L2 for the P.V pass that follows.
  const int head_bytes = a.head_dim * esize;
  auto prefetch = [&](const char* p, auto hint) {
    for (int o = 0; o < head_bytes; o += 64) {
      _mm_prefetch(p + o, decltype(hint)::value);
    }
  };
  using ToL1 = std::integral_constant<_mm_hint, _MM_HINT_T0>;
  using ToL2 = std::integral_constant<_mm_hint, _MM_HINT_T1>;
  // Best of 4..32 measured; even so a decode head reads its KV at ~70% of a
  // plain streaming read's rate (scattered rows: bound by outstanding misses).
  constexpr int kAhead = 16;
  for (int i = 0; i < count; ++i) {
    if (i + kAhead < count) {
      prefetch(rows[i + kAhead], ToL1());
      prefetch(rows[i + kAhead] + v_delta, ToL2());
    }
    const char* k = rows[i];
    const int j = lo + i;
    __m512 kk[kChunks];
    for (int c = 0; c < kChunks; ++c) {
      kk[c] = LoadKv(k + 16 * c * esize, dtype, lanes[c]);
    }
    for (int g = 0; g < kTile; ++g) {
      if (j < qs[g].first || j > qs[g].last) continue;
      __m512 acc = _mm512_setzero_ps();
      for (int c = 0; c < kChunks; ++c) {
        acc = _mm512_fmadd_ps(qv[g][c], kk[c], acc);
      }
      qs[g].scores[j - qs[g].first] = _mm512_reduce_add_ps(acc) * a.scale;
    }
  }
  float inv[kTile];
  for (int g = 0; g < kTile; ++g) {
    inv[g] = SoftmaxExp(qs[g].scores, qs[g].last - qs[g].first + 1);
  }
  __m512 ov[kTile][kChunks];
  for (int g = 0; g < kTile; ++g) {
    for (int c = 0; c < kChunks; ++c) ov[g][c] = _mm512_setzero_ps();
  }
  for (int i = 0; i < count; ++i) {
    if (i + kAhead < count) prefetch(rows[i + kAhead] + v_delta, ToL1());
    const int j = lo + i;
    const char* v = rows[i] + v_delta;
    __m512 vv[kChunks];
    for (int c = 0; c < kChunks; ++c) {
      vv[c] = LoadKv(v + 16 * c * esize, dtype, lanes[c]);
    }
    for (int g = 0; g < kTile; ++g) {
      if (j < qs[g].first || j > qs[g].last) continue;
      const __m512 p = _mm512_set1_ps(qs[g].scores[j - qs[g].first] * inv[g]);
      for (int c = 0; c < kChunks; ++c) {
        ov[g][c] = _mm512_fmadd_ps(p, vv[c], ov[g][c]);
      }
    }
  }
  for (int g = 0; g < kTile; ++g) {
    for (int c = 0; c < kChunks; ++c) {
      _mm512_mask_storeu_ps(qs[g].out + 16 * c,
                            static_cast<__mmask16>((1u << lanes[c]) - 1u),
                            ov[g][c]);
    }
  }
}

constexpr int TileFor(int chunks) {
  return chunks <= 4 ? 4 : (chunks <= 8 ? 2 : 1);
}

template <int... kChunks>
void AttendAvx512Dispatch(std::integer_sequence<int, kChunks...>,
                          const AttentionArgs& a, const AttentionQuery* qs,
                          int n) {
  const int chunks = (a.head_dim + 15) / 16;
  auto run = [&]<int kC>() {
    constexpr int kT = TileFor(kC);
    int g = 0;
    for (; g + kT <= n; g += kT) AttendTileAvx512<kC, kT>(a, qs + g);
    if constexpr (kT > 1) {
      for (; g < n; ++g) AttendTileAvx512<kC, 1>(a, qs + g);
    }
  };
  ((chunks == kChunks + 1 ? run.template operator()<kChunks + 1>() : void()),
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

void AttendHeads(const AttentionArgs& args, const AttentionQuery* queries,
                 int n) {
  if (CpuHasAvx512() && args.head_dim <= 256) {
    AttendAvx512Dispatch(std::make_integer_sequence<int, 16>(), args, queries,
                         n);
    return;
  }
  for (int g = 0; g < n; ++g) {
    AttentionArgs one = args;
    one.first = queries[g].first;
    one.last = queries[g].last;
    AttendScalar(one, queries[g].q, queries[g].scores, queries[g].out);
  }
}

void AttendHead(const AttentionArgs& args, const float* q, float* scores,
                float* out) {
  const AttentionQuery query{q, args.first, args.last, scores, out};
  AttendHeads(args, &query, 1);
}

int AttentionTileRows(int head_dim) {
  return head_dim <= 256 ? TileFor((head_dim + 15) / 16) : 1;
}

}  // namespace pdserve
