#include "common/backend/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "common/backend/cpu/attention_avx2.h"
#include "common/backend/cpu/attention_prefetch.h"
#include "common/backend/cpu/packed_matrix.h"
#include "common/backend/cpu/simd_exp.h"

// GCC 12 reports its own intrinsics' `__m512 __Y = __Y;` idiom (masked
// loads, conversions, reductions) as (maybe-)uninitialized once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve {
namespace {

using cpu_internal::PrefetchDrip;
using cpu_internal::PrefetchRange;

constexpr int kLanes = 16;
// Segments of one partition at most (block_size 1).
constexpr int kMaxSegments = kAttentionPartition;
// Queries one tile computes together at most.
constexpr int kMaxTile = 4;

// A run of consecutive positions of one partition inside one block and one
// aligned group of 16 positions: vector lane i holds position
// (pos - pos % 16) + i, so the lane of position j is always j % 16.
struct Segment {
  const char* k;  // lane i of dimension d at k + (d * block_size + i) * esize
  const char* v;  // V row of `pos` ([head_dim]); the next rows follow
  const char* k_tile;  // the block's K tile (for prefetching)
  int pos;             // first position
  int n;               // positions
  int off;             // offset of `pos` in its block
};

// Segments covering positions [lo, hi] of one partition.
int BuildSegments(const AttentionArgs& a, int lo, int hi, Segment* out) {
  const KvCache& kv = *a.kv;
  const int bs = kv.layout().block_size;
  const int64_t es = DTypeSize(kv.layout().dtype);
  const int64_t v_row = a.head_dim * es;
  int count = 0;
  for (int pos = lo; pos <= hi;) {
    const int b = pos / bs;
    const int off = pos - b * bs;
    const int lane0 = pos % kLanes;
    const int n = std::min({hi - pos + 1, bs - off, kLanes - lane0});
    const int32_t block = (*a.table)[b];
    const char* k_tile = kv.KeyTile(block, a.layer, a.kv_head);
    out[count++] = {k_tile + (off - lane0) * es,
                    kv.ValueTile(block, a.layer, a.kv_head) + off * v_row,
                    k_tile,
                    pos,
                    n,
                    off};
    pos += n;
  }
  return count;
}

// What the segments read of one head's K tiles ([head_dim][block_size]: the
// columns of the segments' positions, i.e. the whole tile unless the block
// is longer than a partition) and V rows, as byte ranges.
int PrefetchRanges(const Segment* seg, int nseg, int head_dim, int block_size,
                   int esize, PrefetchRange* out) {
  int count = 0;
  for (int s = 0; s < nseg;) {
    // Segments of one block are consecutive.
    int t = s + 1;
    while (t < nseg && seg[t].k_tile == seg[s].k_tile) ++t;
    const int64_t first = seg[s].off;
    const int64_t end = seg[t - 1].off + seg[t - 1].n;
    const PrefetchRange k = {
        seg[s].k_tile + first * esize,
        ((head_dim - 1) * int64_t{block_size} + end - first) * esize};
    const PrefetchRange v = {seg[s].v, (end - first) * head_dim * esize};
    for (const PrefetchRange& r : {k, v}) {
      // A block's K and V tiles, and the tiles of consecutive blocks, are
      // adjacent in the pool: one range, fewer switches in the drip.
      if (count > 0 && out[count - 1].from + out[count - 1].bytes == r.from) {
        out[count - 1].bytes += r.bytes;
      } else {
        out[count++] = r;
      }
    }
    s = t;
  }
  return count;
}

// The positions of partition `p` that query `q` attends: [*vf, *vl], empty
// when *vf > *vl.
void ValidRange(const AttentionQuery& q, int p, int* vf, int* vl) {
  *vf = std::max(q.first, p * kAttentionPartition);
  *vl = std::min(q.last, p * kAttentionPartition + kAttentionPartition - 1);
}

// Everything up to the matching pop is compiled for AVX-512 and only runs
// when CpuHasAvx512() (lambdas included, hence the pragma).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")

#define PDSERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

// 16 lanes of K (masked) as f32.
template <bool kBf16>
PDSERVE_AVX512 inline __m512 LoadLanes(const char* p, __mmask16 m) {
  if constexpr (kBf16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_maskz_loadu_ps(m, p);
  }
}

// `n` <= 16 consecutive values of a V row as f32 (zero-filled).
template <bool kBf16>
PDSERVE_AVX512 inline __m512 LoadRow(const char* p, int n) {
  return LoadLanes<kBf16>(p, static_cast<__mmask16>((1u << n) - 1u));
}

PDSERVE_AVX512 inline __mmask16 SegmentMask(const Segment& s) {
  return static_cast<__mmask16>(((1u << s.n) - 1u) << (s.pos % kLanes));
}

// Scores of kQ queries over the segments, into sc[g][j - p0] (scaled; only
// the segments' lanes are written). kSeg segments at a time keep kQ * kSeg
// independent FMA chains in flight; each lane is one chain over d.
template <bool kBf16, int kQ, int kSeg>
PDSERVE_AVX512 void Scores(const AttentionArgs& a, const AttentionQuery* qs,
                           const Segment* seg, int nseg, int p0,
                           float (*sc)[kAttentionPartition],
                           PrefetchDrip& drip) {
  const int head_dim = a.head_dim;
  const int64_t dim_stride =
      int64_t{a.kv->layout().block_size} * (kBf16 ? 2 : 4);
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int s0 = 0; s0 < nseg; s0 += kSeg) {
    const char* kp[kSeg];
    __mmask16 m[kSeg];
    for (int s = 0; s < kSeg; ++s) {
      const bool real = s0 + s < nseg;
      kp[s] = seg[real ? s0 + s : s0].k;
      m[s] = real ? SegmentMask(seg[s0 + s]) : 0;
    }
    // Unrolled by pragma: without it GCC 12 kept a copy of acc on the stack
    // and stored all of it every d (8 zmm stores per 8 FMAs).
    __m512 acc[kQ][kSeg];
#pragma GCC unroll 8
    for (int g = 0; g < kQ; ++g) {
#pragma GCC unroll 8
      for (int s = 0; s < kSeg; ++s) acc[g][s] = _mm512_setzero_ps();
    }
    for (int d = 0; d < head_dim; ++d) {
      drip.Step();
      __m512 kk[kSeg];
#pragma GCC unroll 8
      for (int s = 0; s < kSeg; ++s) {
        kk[s] = LoadLanes<kBf16>(kp[s] + d * dim_stride, m[s]);
      }
#pragma GCC unroll 8
      for (int g = 0; g < kQ; ++g) {
        const __m512 qd = _mm512_set1_ps(qs[g].q[d]);
#pragma GCC unroll 8
        for (int s = 0; s < kSeg; ++s) {
          acc[g][s] = _mm512_fmadd_ps(qd, kk[s], acc[g][s]);
        }
      }
    }
    // Every s (a missing segment's mask is 0: its stores write nothing), so
    // that this loop unrolls too.
#pragma GCC unroll 8
    for (int s = 0; s < kSeg; ++s) {
      const Segment& sg = seg[s0 + s < nseg ? s0 + s : s0];
      const int at = sg.pos - sg.pos % kLanes - p0;
#pragma GCC unroll 8
      for (int g = 0; g < kQ; ++g) {
        _mm512_mask_storeu_ps(sc[g] + at, m[s],
                              _mm512_mul_ps(acc[g][s], scale));
      }
    }
  }
}

// Max and sum of exponentials of sc[vf - p0 .. vl - p0], which become the
// exponentials e_j = exp(s_j - max) in place.
PDSERVE_AVX512 void SoftmaxStats(float* sc, int p0, int vf, int vl,
                                 float* max_out, float* sum_out) {
  auto mask = [&](int t) {
    const int lo = std::max(vf - p0 - t, 0);
    const int hi = std::min(vl - p0 - t, kLanes - 1);
    return static_cast<__mmask16>(((2u << hi) - 1u) & ~((1u << lo) - 1u));
  };
  const int t0 = (vf - p0) / kLanes * kLanes;
  const int t1 = (vl - p0) / kLanes * kLanes;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int t = t0; t <= t1; t += kLanes) {
    const __mmask16 m = mask(t);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, sc + t));
  }
  const float max = _mm512_reduce_max_ps(mx);
  const __m512 mv = _mm512_set1_ps(max);
  __m512 sum = _mm512_setzero_ps();
  for (int t = t0; t <= t1; t += kLanes) {
    const __mmask16 m = mask(t);
    const __m512 e =
        Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + t), mv));
    _mm512_mask_storeu_ps(sc + t, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  *max_out = max;
  *sum_out = _mm512_reduce_add_ps(sum);
}

// acc_g = FMA chain over the positions j in increasing order of
// e_g[j] * v_j, for the queries with vf[g] <= j <= vl[g]; stored at out[g].
template <bool kBf16, int kChunks, int kQ>
PDSERVE_AVX512 void Values(const AttentionArgs& a, const Segment* seg, int nseg,
                           int p0, const float (*e)[kAttentionPartition],
                           const int* vf, const int* vl, float* const* out,
                           PrefetchDrip& drip) {
  constexpr int kEs = kBf16 ? 2 : 4;
  int lanes[kChunks];
  for (int c = 0; c < kChunks; ++c) {
    lanes[c] = std::min(kLanes, a.head_dim - kLanes * c);
  }
  const int64_t row = int64_t{a.head_dim} * kEs;
  __m512 acc[kQ][kChunks];
  for (int g = 0; g < kQ; ++g) {
    for (int c = 0; c < kChunks; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int s = 0; s < nseg; ++s) {
    const char* v = seg[s].v;
    const int end = seg[s].pos + seg[s].n;
    for (int j = seg[s].pos; j < end; ++j, v += row) {
      drip.Step();
      __m512 vv[kChunks];
      for (int c = 0; c < kChunks; ++c) {
        vv[c] = LoadRow<kBf16>(v + kLanes * c * kEs, lanes[c]);
      }
      for (int g = 0; g < kQ; ++g) {
        if (j < vf[g] || j > vl[g]) continue;
        const __m512 p = _mm512_set1_ps(e[g][j - p0]);
        for (int c = 0; c < kChunks; ++c) {
          acc[g][c] = _mm512_fmadd_ps(p, vv[c], acc[g][c]);
        }
      }
    }
  }
  for (int g = 0; g < kQ; ++g) {
    if (out[g] == nullptr) continue;
    for (int c = 0; c < kChunks; ++c) {
      _mm512_mask_storeu_ps(out[g] + kLanes * c,
                            static_cast<__mmask16>((1u << lanes[c]) - 1u),
                            acc[g][c]);
    }
  }
}

// Partitions [pb, pe) of kQ queries; partials[g] as in AttendPartitions.
template <bool kBf16, int kChunks, int kQ>
PDSERVE_AVX512 void TilePartitions(const AttentionArgs& a,
                                   const AttentionQuery* qs,
                                   float* const* partials, int pb, int pe) {
  int lo = qs[0].first, hi = qs[0].last;
  for (int g = 1; g < kQ; ++g) {
    lo = std::min(lo, qs[g].first);
    hi = std::max(hi, qs[g].last);
  }
  const int p_first = std::max(pb, AttentionPartitionOf(lo));
  const int p_last = std::min(pe - 1, AttentionPartitionOf(hi));
  if (p_first > p_last) return;
  const int stride = AttentionPartialFloats(a.head_dim);
  const int bs = a.kv->layout().block_size;
  constexpr int kEs = kBf16 ? 2 : 4;
  Segment segs[2][kMaxSegments];
  int nsegs[2];
  alignas(64) float sc[kQ][kAttentionPartition];
  auto build = [&](int p, Segment* out) {
    const int p0 = p * kAttentionPartition;
    return BuildSegments(a, std::max(lo, p0),
                         std::min(hi, p0 + kAttentionPartition - 1), out);
  };
  constexpr int kSeg = 8 / kQ;
  PrefetchRange ranges[2 * kMaxSegments];
  PrefetchDrip drip;
  nsegs[0] = build(p_first, segs[0]);
  // The first partition at once (nothing to overlap with); each next one
  // dripped through the work on the current one.
  drip.Reset(ranges,
             PrefetchRanges(segs[0], nsegs[0], a.head_dim, bs, kEs, ranges), 0);
  drip.Finish();
  for (int p = p_first; p <= p_last; ++p) {
    const int cur = (p - p_first) & 1;
    const Segment* seg = segs[cur];
    const int nseg = nsegs[cur];
    const int p0 = p * kAttentionPartition;
    if (p < p_last) {
      nsegs[cur ^ 1] = build(p + 1, segs[cur ^ 1]);
      int positions = 0;
      for (int s = 0; s < nseg; ++s) positions += seg[s].n;
      drip.Reset(ranges,
                 PrefetchRanges(segs[cur ^ 1], nsegs[cur ^ 1], a.head_dim, bs,
                                kEs, ranges),
                 int64_t{a.head_dim} * ((nseg + kSeg - 1) / kSeg) + positions);
    } else {
      drip.Reset(ranges, 0, 0);
    }
    Scores<kBf16, kQ, kSeg>(a, qs, seg, nseg, p0, sc, drip);
    int vf[kQ], vl[kQ];
    float* out[kQ];
    for (int g = 0; g < kQ; ++g) {
      ValidRange(qs[g], p, &vf[g], &vl[g]);
      out[g] = nullptr;
      if (vf[g] > vl[g]) continue;
      out[g] = partials[g] +
               (p - AttentionPartitionOf(qs[g].first)) * int64_t{stride};
      SoftmaxStats(sc[g], p0, vf[g], vl[g], &out[g][0], &out[g][1]);
      out[g] += 2;
    }
    Values<kBf16, kChunks, kQ>(a, seg, nseg, p0, sc, vf, vl, out, drip);
    drip.Finish();
  }
}

template <bool kBf16, int kChunks>
PDSERVE_AVX512 void PartitionsAvx512(const AttentionArgs& a,
                                     const AttentionQuery* qs,
                                     float* const* partials, int n, int pb,
                                     int pe) {
  constexpr int kTile = kChunks <= 4 ? 4 : (kChunks <= 8 ? 2 : 1);
  int g = 0;
  for (; g + kTile <= n; g += kTile) {
    TilePartitions<kBf16, kChunks, kTile>(a, qs + g, partials + g, pb, pe);
  }
  const int rest = n - g;
  if constexpr (kTile > 1) {
    if (rest == 1) {
      TilePartitions<kBf16, kChunks, 1>(a, qs + g, partials + g, pb, pe);
    }
  }
  if constexpr (kTile > 2) {
    if (rest == 2) {
      TilePartitions<kBf16, kChunks, 2>(a, qs + g, partials + g, pb, pe);
    }
    if (rest == 3) {
      TilePartitions<kBf16, kChunks, 3>(a, qs + g, partials + g, pb, pe);
    }
  }
}

template <int... kC>
void DispatchAvx512(std::integer_sequence<int, kC...>, const AttentionArgs& a,
                    const AttentionQuery* qs, float* const* partials, int n,
                    int pb, int pe) {
  const int chunks = (a.head_dim + kLanes - 1) / kLanes;
  const bool bf16 = a.kv->layout().dtype == DType::kBF16;
  ((chunks == kC + 1
        ? (bf16 ? PartitionsAvx512<true, kC + 1>(a, qs, partials, n, pb, pe)
                : PartitionsAvx512<false, kC + 1>(a, qs, partials, n, pb, pe))
        : void()),
   ...);
}

PDSERVE_AVX512 void CombineAvx512(const AttentionQuery& q, int head_dim,
                                  const float* partials, int parts) {
  const int stride = AttentionPartialFloats(head_dim);
  float max = -INFINITY;
  for (int i = 0; i < parts; ++i) max = std::max(max, partials[i * stride]);
  float sum = 0.0f;
  for (int d = 0; d < head_dim; ++d) q.out[d] = 0.0f;
  for (int i = 0; i < parts; ++i) {
    const float* part = partials + i * stride;
    const __m512 w = Exp512(_mm512_set1_ps(part[0] - max));
    sum = std::fma(_mm512_cvtss_f32(w), part[1], sum);
    for (int c = 0; c < head_dim; c += kLanes) {
      const __mmask16 m =
          static_cast<__mmask16>((1u << std::min(kLanes, head_dim - c)) - 1u);
      _mm512_mask_storeu_ps(
          q.out + c, m,
          _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, part + 2 + c),
                          _mm512_maskz_loadu_ps(m, q.out + c)));
    }
  }
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (int c = 0; c < head_dim; c += kLanes) {
    const __mmask16 m =
        static_cast<__mmask16>((1u << std::min(kLanes, head_dim - c)) - 1u);
    _mm512_mask_storeu_ps(
        q.out + c, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, q.out + c), inv));
  }
}

#undef PDSERVE_AVX512
#pragma GCC pop_options

// ---- Portable path (no AVX2, or head_dim > 256): the same arithmetic in
// scalar code (ExpScalar: Exp512's steps on one float).

float LoadElement(const char* p, DType dtype, int64_t i) {
  if (dtype == DType::kBF16) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    return Bf16ToF32(v);
  }
  float f;
  std::memcpy(&f, p + 4 * i, 4);
  return f;
}

void PartitionScalar(const AttentionArgs& a, const AttentionQuery& q, int p,
                     float* out) {
  int vf, vl;
  ValidRange(q, p, &vf, &vl);
  const DType dtype = a.kv->layout().dtype;
  const int bs = a.kv->layout().block_size;
  const int D = a.head_dim;
  float e[kAttentionPartition];
  float max = -INFINITY;
  for (int j = vf; j <= vl; ++j) {
    const int32_t block = (*a.table)[j / bs];
    const char* k = a.kv->KeyTile(block, a.layer, a.kv_head);
    float s = 0.0f;
    for (int d = 0; d < D; ++d) {
      s = std::fma(q.q[d], LoadElement(k, dtype, int64_t{d} * bs + j % bs), s);
    }
    e[j - vf] = s * a.scale;
    max = std::max(max, e[j - vf]);
  }
  float lanes[kLanes] = {};
  for (int j = vf; j <= vl; ++j) {
    e[j - vf] = ExpScalar(e[j - vf] - max);
    lanes[j % kLanes] += e[j - vf];
  }
  const float sum = cpu_internal::LaneSum(lanes);
  float* acc = out + 2;
  for (int d = 0; d < D; ++d) acc[d] = 0.0f;
  for (int j = vf; j <= vl; ++j) {
    const int32_t block = (*a.table)[j / bs];
    const char* v = a.kv->ValueTile(block, a.layer, a.kv_head);
    for (int d = 0; d < D; ++d) {
      acc[d] = std::fma(e[j - vf],
                        LoadElement(v, dtype, int64_t{j % bs} * D + d), acc[d]);
    }
  }
  out[0] = max;
  out[1] = sum;
}

void CombineScalar(const AttentionQuery& q, int head_dim, const float* partials,
                   int parts) {
  const int stride = AttentionPartialFloats(head_dim);
  float max = -INFINITY;
  for (int i = 0; i < parts; ++i) max = std::max(max, partials[i * stride]);
  float sum = 0.0f;
  for (int d = 0; d < head_dim; ++d) q.out[d] = 0.0f;
  for (int i = 0; i < parts; ++i) {
    const float* part = partials + i * stride;
    const float w = ExpScalar(part[0] - max);
    sum = std::fma(w, part[1], sum);
    for (int d = 0; d < head_dim; ++d) {
      q.out[d] = std::fma(w, part[2 + d], q.out[d]);
    }
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < head_dim; ++d) q.out[d] *= inv;
}

bool UseAvx512(int head_dim) { return CpuHasAvx512() && head_dim <= 256; }
bool UseAvx2(int head_dim) {
  return !CpuHasAvx512() && CpuHasAvx2() && head_dim <= 256;
}

}  // namespace

void AttendPartitions(const AttentionArgs& args, const AttentionQuery* queries,
                      float* const* partials, int n, int part_begin,
                      int part_end) {
  if (UseAvx512(args.head_dim)) {
    DispatchAvx512(std::make_integer_sequence<int, 16>(), args, queries,
                   partials, n, part_begin, part_end);
    return;
  }
  const int stride = AttentionPartialFloats(args.head_dim);
  for (int g = 0; g < n; ++g) {
    const int first = AttentionPartitionOf(queries[g].first);
    const int last = AttentionPartitionOf(queries[g].last);
    for (int p = std::max(first, part_begin); p <= std::min(last, part_end - 1);
         ++p) {
      if (UseAvx2(args.head_dim)) {
        cpu_internal::AttentionPartitionAvx2(
            args, queries[g], p, partials[g] + (p - first) * int64_t{stride});
        continue;
      }
      PartitionScalar(args, queries[g], p,
                      partials[g] + (p - first) * int64_t{stride});
    }
  }
}

void CombineAttention(const AttentionQuery& query, int head_dim,
                      const float* partials) {
  const int parts =
      AttentionPartitionOf(query.last) - AttentionPartitionOf(query.first) + 1;
  if (UseAvx512(head_dim)) {
    CombineAvx512(query, head_dim, partials, parts);
  } else if (UseAvx2(head_dim)) {
    cpu_internal::CombineAttentionAvx2(query, head_dim, partials, parts);
  } else {
    CombineScalar(query, head_dim, partials, parts);
  }
}

void AttendHeads(const AttentionArgs& args, const AttentionQuery* queries,
                 int n) {
  const int tile = std::min(kMaxTile, AttentionTileQueries(args.head_dim));
  const int stride = AttentionPartialFloats(args.head_dim);
  thread_local std::vector<float> buffer;
  for (int g0 = 0; g0 < n; g0 += tile) {
    const int count = std::min(tile, n - g0);
    int64_t offsets[kMaxTile + 1] = {0};
    for (int g = 0; g < count; ++g) {
      const AttentionQuery& q = queries[g0 + g];
      offsets[g + 1] =
          offsets[g] + int64_t{stride} * (AttentionPartitionOf(q.last) -
                                          AttentionPartitionOf(q.first) + 1);
    }
    if (static_cast<int64_t>(buffer.size()) < offsets[count]) {
      buffer.resize(offsets[count]);
    }
    float* partials[kMaxTile];
    for (int g = 0; g < count; ++g) partials[g] = buffer.data() + offsets[g];
    AttendPartitions(args, queries + g0, partials, count, 0, INT_MAX);
    for (int g = 0; g < count; ++g) {
      CombineAttention(queries[g0 + g], args.head_dim, partials[g]);
    }
  }
}

int AttentionTileQueries(int head_dim) {
  if (head_dim > 256) return 1;
  const int chunks = (head_dim + kLanes - 1) / kLanes;
  return chunks <= 4 ? 4 : (chunks <= 8 ? 2 : 1);
}

}  // namespace pdserve
