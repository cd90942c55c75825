#include "common/backend/cpu/attention_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/backend/cpu/simd_exp.h"

namespace pdserve::cpu_internal {
namespace {

constexpr int kMaxDim = 256;
// Scores of this many 8-position groups at once: independent FMA chains.
constexpr int kGroupsAtOnce = 4;

// Everything up to the matching pop is compiled for AVX2+FMA and only runs
// when CpuHasAvx2().
#pragma GCC push_options
#pragma GCC target("avx2,fma")

// Up to 8 consecutive positions of one block: lane i is position j0 + i.
struct Group {
  const char* k;  // K tile element (d = 0, offset of j0)
  int j0;
  int n;
};

// `n` (<= 8) consecutive elements at p as f32 lanes (zero past n).
template <bool kBf16>
inline __m256 Load8(const char* p, int n) {
  if constexpr (kBf16) {
    __m128i h;
    if (n == 8) {
      h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {
      alignas(16) uint16_t t[8] = {};
      std::memcpy(t, p, static_cast<size_t>(n) * 2);
      h = _mm_load_si128(reinterpret_cast<const __m128i*>(t));
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    if (n == 8) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    alignas(32) int lanes[8];
    for (int i = 0; i < 8; ++i) lanes[i] = i < n ? -1 : 0;
    return _mm256_maskload_ps(
        reinterpret_cast<const float*>(p),
        _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes)));
  }
}

// s_j (scaled) for the groups g[0, kG) into sc[j - vf].
template <bool kBf16, int kG>
inline void ScoreGroups(const AttentionArgs& a, const float* q, const Group* g,
                        int vf, float* sc) {
  const int64_t dim_stride =
      int64_t{a.kv->layout().block_size} * (kBf16 ? 2 : 4);
  __m256 acc[kG];
  for (int i = 0; i < kG; ++i) acc[i] = _mm256_setzero_ps();
  for (int d = 0; d < a.head_dim; ++d) {
    const __m256 qd = _mm256_broadcast_ss(q + d);
    for (int i = 0; i < kG; ++i) {
      acc[i] = _mm256_fmadd_ps(
          qd, Load8<kBf16>(g[i].k + d * dim_stride, g[i].n), acc[i]);
    }
  }
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int i = 0; i < kG; ++i) {
    alignas(32) float s[8];
    _mm256_store_ps(s, _mm256_mul_ps(acc[i], scale));
    std::memcpy(sc + g[i].j0 - vf, s, static_cast<size_t>(g[i].n) * 4);
  }
}

// bf16: 16 consecutive elements at p, one load: the even-indexed ones
// (low halves shifted up) and the odd-indexed ones (high halves) as f32.
// Which lane holds an element changes, never its arithmetic.
inline void Load16Bf16(const char* p, __m256* even, __m256* odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  *odd = _mm256_castsi256_ps(
      _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// Stores the even- and odd-indexed elements of 16 consecutive ones in order.
inline void StoreInterleaved(const __m256 even, const __m256 odd, float* p) {
  const __m256 lo = _mm256_unpacklo_ps(even, odd);  // 0 1 2 3 | 8 9 10 11
  const __m256 hi = _mm256_unpackhi_ps(even, odd);  // 4 5 6 7 | 12 .. 15
  _mm256_storeu_ps(p, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

// bf16 K, groups of 16 positions (g[i].n == 16): s_j as ScoreGroups, each
// load of a K row serving 16 positions.
template <int kG>
inline void ScoreWideGroupsBf16(const AttentionArgs& a, const float* q,
                                const Group* g, int vf, float* sc) {
  const int64_t dim_stride = int64_t{a.kv->layout().block_size} * 2;
  __m256 even[kG], odd[kG];
  for (int i = 0; i < kG; ++i) even[i] = odd[i] = _mm256_setzero_ps();
  for (int d = 0; d < a.head_dim; ++d) {
    const __m256 qd = _mm256_broadcast_ss(q + d);
    for (int i = 0; i < kG; ++i) {
      __m256 ke, ko;
      Load16Bf16(g[i].k + d * dim_stride, &ke, &ko);
      even[i] = _mm256_fmadd_ps(qd, ke, even[i]);
      odd[i] = _mm256_fmadd_ps(qd, ko, odd[i]);
    }
  }
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int i = 0; i < kG; ++i) {
    StoreInterleaved(_mm256_mul_ps(even[i], scale),
                     _mm256_mul_ps(odd[i], scale), sc + g[i].j0 - vf);
  }
}

// The scores of every group: bf16 whole groups of 16 four or one at a time,
// else (f32, and bf16 groups cut by a block or partition edge) 8 positions
// per vector.
// (GCC 12 cannot see that groups[0, ng) were all written by Partition:
// silenced up to the AVX2 region's end.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <bool kBf16>
inline void ScoreAllGroups(const AttentionArgs& a, const float* q,
                           const Group* groups, int ng, int vf, float* sc) {
  if constexpr (!kBf16) {
    int gi = 0;
    for (; gi + kGroupsAtOnce <= ng; gi += kGroupsAtOnce) {
      ScoreGroups<false, kGroupsAtOnce>(a, q, groups + gi, vf, sc);
    }
    for (; gi < ng; ++gi) ScoreGroups<false, 1>(a, q, groups + gi, vf, sc);
  } else {
    for (int gi = 0; gi < ng;) {
      const Group& g = groups[gi];
      if (g.n == 16) {
        int whole = 1;
        while (whole < kGroupsAtOnce && gi + whole < ng &&
               groups[gi + whole].n == 16) {
          ++whole;
        }
        if (whole == kGroupsAtOnce) {
          ScoreWideGroupsBf16<kGroupsAtOnce>(a, q, groups + gi, vf, sc);
        } else {
          for (int i = 0; i < whole; ++i) {
            ScoreWideGroupsBf16<1>(a, q, groups + gi + i, vf, sc);
          }
        }
        gi += whole;
        continue;
      }
      const Group halves[2] = {{g.k, g.j0, std::min(g.n, 8)},
                               {g.k + 16, g.j0 + 8, g.n - 8}};
      ScoreGroups<true, 1>(a, q, &halves[0], vf, sc);
      if (g.n > 8) ScoreGroups<true, 1>(a, q, &halves[1], vf, sc);
      ++gi;
    }
  }
}

// kWideV: bf16 V rows read 16 dimensions per load (head_dim a multiple of
// 8, so that no load passes a row's end).
template <bool kBf16, int kChunks, bool kWideV>
void Partition(const AttentionArgs& a, const AttentionQuery& q, int vf, int vl,
               float* out) {
  constexpr int kEs = kBf16 ? 2 : 4;
  const KvCache& kv = *a.kv;
  const int bs = kv.layout().block_size;
  const int D = a.head_dim;
  // Scores, position groups within one block each (bf16: up to 16, one
  // load of a K row for all).
  constexpr int kGroupMax = kBf16 ? 16 : 8;
  Group groups[kAttentionPartition];
  int ng = 0;
  for (int j = vf; j <= vl;) {
    const int b = j / bs;
    const int off = j - b * bs;
    const int n = std::min({vl - j + 1, bs - off, kGroupMax});
    groups[ng++] = {kv.KeyTile((*a.table)[b], a.layer, a.kv_head) + off * kEs,
                    j, n};
    j += n;
  }
  alignas(32) float sc[kAttentionPartition];
  ScoreAllGroups<kBf16>(a, q.q, groups, ng, vf, sc);
  const int n = vl - vf + 1;
  float max = -INFINITY;
  for (int i = 0; i < n; ++i) max = std::max(max, sc[i]);
  // e_j = exp(s_j - max) in place, 8 at a time (lanes past n unused).
  const __m256 mv = _mm256_set1_ps(max);
  for (int i = 0; i < n; i += 8) {
    _mm256_store_ps(sc + i, Exp256(_mm256_sub_ps(_mm256_load_ps(sc + i), mv)));
  }
  float lanes[16] = {};
  for (int j = vf; j <= vl; ++j) lanes[j % 16] += sc[j - vf];
  // acc = FMA chain over j of e_j * v_j, 8 dimensions per vector; bf16
  // reads 16 dimensions per load into even[w]/odd[w] (dimensions 16w + 2i
  // and 16w + 2i + 1 in lane i), the rest into acc[c] for c >= 2 * kWide.
  constexpr int kWide = kBf16 && kWideV ? kChunks / 2 : 0;
  __m256 even[kWide > 0 ? kWide : 1], odd[kWide > 0 ? kWide : 1];
  for (int w = 0; w < kWide; ++w) even[w] = odd[w] = _mm256_setzero_ps();
  alignas(32) int tail_lanes[8];
  const int tail = D - 8 * (kChunks - 1);
  for (int i = 0; i < 8; ++i) tail_lanes[i] = i < tail ? -1 : 0;
  const __m256i tail_mask =
      _mm256_load_si256(reinterpret_cast<const __m256i*>(tail_lanes));
  __m256 acc[kChunks];
  for (int c = 0; c < kChunks; ++c) acc[c] = _mm256_setzero_ps();
  const int64_t row = int64_t{D} * kEs;
  for (int j = vf; j <= vl;) {
    const int b = j / bs;
    const int off = j - b * bs;
    const int end = std::min(vl + 1, j - off + bs);
    const char* v = kv.ValueTile((*a.table)[b], a.layer, a.kv_head) + off * row;
    for (; j < end; ++j, v += row) {
      const __m256 e = _mm256_set1_ps(sc[j - vf]);
      for (int w = 0; w < kWide; ++w) {
        __m256 ve, vo;
        Load16Bf16(v + 32 * w, &ve, &vo);
        even[w] = _mm256_fmadd_ps(e, ve, even[w]);
        odd[w] = _mm256_fmadd_ps(e, vo, odd[w]);
      }
      for (int c = 2 * kWide; c < kChunks; ++c) {
        __m256 vv;
        if (c + 1 < kChunks || tail == 8) {
          vv = Load8<kBf16>(v + 8 * c * kEs, 8);
        } else if constexpr (kBf16) {
          vv = Load8<kBf16>(v + 8 * c * kEs, tail);
        } else {
          vv = _mm256_maskload_ps(reinterpret_cast<const float*>(v) + 8 * c,
                                  tail_mask);
        }
        acc[c] = _mm256_fmadd_ps(e, vv, acc[c]);
      }
    }
  }
  for (int w = 0; w < kWide; ++w) {
    StoreInterleaved(even[w], odd[w], out + 2 + 16 * w);
  }
  for (int c = 2 * kWide; c < kChunks; ++c) {
    if (c + 1 < kChunks || tail == 8) {
      _mm256_storeu_ps(out + 2 + 8 * c, acc[c]);
    } else {
      _mm256_maskstore_ps(out + 2 + 8 * c, tail_mask, acc[c]);
    }
  }
  out[0] = max;
  out[1] = LaneSum(lanes);
}

template <int... kC>
void Dispatch(std::integer_sequence<int, kC...>, const AttentionArgs& a,
              const AttentionQuery& q, int vf, int vl, float* out) {
  const int chunks = (a.head_dim + 7) / 8;
  const bool bf16 = a.kv->layout().dtype == DType::kBF16;
  const bool whole_chunks = a.head_dim % 8 == 0;
  ((chunks == kC + 1
        ? (!bf16          ? Partition<false, kC + 1, false>(a, q, vf, vl, out)
           : whole_chunks ? Partition<true, kC + 1, true>(a, q, vf, vl, out)
                          : Partition<true, kC + 1, false>(a, q, vf, vl, out))
        : void()),
   ...);
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx2,fma")

void AttentionPartitionAvx2(const AttentionArgs& a, const AttentionQuery& q,
                            int p, float* out) {
  const int vf = std::max(q.first, p * kAttentionPartition);
  const int vl =
      std::min(q.last, p * kAttentionPartition + kAttentionPartition - 1);
  if (vf > vl || a.head_dim > kMaxDim) return;
  Dispatch(std::make_integer_sequence<int, kMaxDim / 8>(), a, q, vf, vl, out);
}

void CombineAttentionAvx2(const AttentionQuery& q, int head_dim,
                          const float* partials, int parts) {
  const int stride = AttentionPartialFloats(head_dim);
  float max = -INFINITY;
  for (int i = 0; i < parts; ++i) max = std::max(max, partials[i * stride]);
  float sum = 0.0f;
  for (int d = 0; d < head_dim; ++d) q.out[d] = 0.0f;
  for (int i = 0; i < parts; ++i) {
    const float* part = partials + i * stride;
    const __m256 w = Exp256(_mm256_set1_ps(part[0] - max));
    sum = std::fma(_mm256_cvtss_f32(w), part[1], sum);
    int d = 0;
    for (; d + 8 <= head_dim; d += 8) {
      _mm256_storeu_ps(q.out + d,
                       _mm256_fmadd_ps(w, _mm256_loadu_ps(part + 2 + d),
                                       _mm256_loadu_ps(q.out + d)));
    }
    const float ws = _mm256_cvtss_f32(w);
    for (; d < head_dim; ++d) q.out[d] = std::fma(ws, part[2 + d], q.out[d]);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < head_dim; ++d) q.out[d] *= inv;
}

#pragma GCC pop_options

}  // namespace pdserve::cpu_internal
