// Paged attention on the CPU over the pool's tiles (KvCache::KeyTile /
// ValueTile): one query head against positions [first, last] of its
// sequence, computed in fixed context partitions whose partial softmax
// states combine in partition order, so a thread split of the context never
// changes a bit. Pure functions; thread-safe.
//
// The arithmetic of one query (what batch invariance rests on):
//   partitions are the absolute position ranges [128 p, 128 p + 128);
//   per partition p intersecting [first, last], over its positions j:
//     s_j   = (FMA chain over d = 0..head_dim-1 of q[d] * k_j[d]) * scale
//     m_p   = max s_j
//     e_j   = exp(s_j - m_p)       (Cephes' polynomial, simd_exp.h)
//     sum_p = 16 lanes (lane j % 16) summed in increasing j, then reduced
//             pairwise as cpu_internal::LaneSum (attention_avx2.h)
//     acc_p = FMA chain over j increasing of e_j * v_j
//   combine in increasing p: M = max m_p, w_p = exp(m_p - M),
//     S = FMA chain of w_p * sum_p, out = (FMA chain of w_p * acc_p) * (1/S).
// Nothing depends on which queries share a call, which thread computes a
// partition, the batch, or how the prompt was chunked; nor on the CPU: the
// AVX-512, AVX2 (attention_avx2.h) and scalar paths compute the same bits.
#ifndef PDSERVE_COMMON_BACKEND_CPU_ATTENTION_H_
#define PDSERVE_COMMON_BACKEND_CPU_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "common/kv/kv_cache.h"

namespace pdserve {

// Positions per context partition (absolute: partition p is
// [p * kAttentionPartition, (p + 1) * kAttentionPartition)).
inline constexpr int kAttentionPartition = 128;

// The sequence, layer and kv head a call attends over.
struct AttentionArgs {
  const KvCache* kv;
  const std::vector<int32_t>* table;
  int layer;
  int kv_head;
  int head_dim;
  float scale;
};

// One query head: positions [first, last], `out` head_dim floats.
struct AttentionQuery {
  const float* q;
  int first;
  int last;
  float* out;
};

// Floats of one partition's partial state: {max, sum, acc[head_dim]}.
inline int AttentionPartialFloats(int head_dim) { return head_dim + 2; }
inline int AttentionPartitionOf(int pos) { return pos / kAttentionPartition; }

// Attention of n queries sharing args' sequence, layer and kv head (e.g. the
// heads of a GQA group, several rows of a prefill chunk): tiles of
// AttentionTileQueries(head_dim) queries share their K and V loads. Each
// query's result is bit-identical to computing it alone.
void AttendHeads(const AttentionArgs& args, const AttentionQuery* queries,
                 int n);

// The same in two steps, for a thread split of the context: partial states
// of partitions [part_begin, part_end) of each query (clipped to its
// [first, last]; partition p of query i is written at partials[i] +
// (p - AttentionPartitionOf(first_i)) * AttentionPartialFloats(head_dim)),
// then CombineAttention once all of a query's partitions are written.
void AttendPartitions(const AttentionArgs& args, const AttentionQuery* queries,
                      float* const* partials, int n, int part_begin,
                      int part_end);
void CombineAttention(const AttentionQuery& query, int head_dim,
                      const float* partials);

// How many queries AttendHeads computes together (callers group that many).
int AttentionTileQueries(int head_dim);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_ATTENTION_H_
