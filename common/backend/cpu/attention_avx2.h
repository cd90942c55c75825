// Attention's AVX2+FMA path (CPUs without AVX-512): one query and one
// context partition at a time, with exactly the arithmetic attention.h
// documents (Exp256 for the exponentials, the 16 lane sums reduced as
// LaneSum does), hence the same bits as the AVX-512 and scalar paths.
// Pure functions; thread-safe. Call only when CpuHasAvx2().
#ifndef PDSERVE_COMMON_BACKEND_CPU_ATTENTION_AVX2_H_
#define PDSERVE_COMMON_BACKEND_CPU_ATTENTION_AVX2_H_

#include "common/backend/cpu/attention.h"

namespace pdserve::cpu_internal {

// Partition p of `q` (clipped to [q.first, q.last]) into `out`
// ({max, sum, acc[head_dim]}); head_dim <= 256.
void AttentionPartitionAvx2(const AttentionArgs& a, const AttentionQuery& q,
                            int p, float* out);
// The combine of `parts` partial states into q.out.
void CombineAttentionAvx2(const AttentionQuery& q, int head_dim,
                          const float* partials, int parts);

// The documented reduction of the 16 lane sums of a partition (the order
// of AVX-512's _mm512_reduce_add_ps): halves added lane-wise, 16 -> 8 ->
// 4 -> 2 -> 1.
inline float LaneSum(const float* l) {
  float s[8], u[4];
  for (int i = 0; i < 8; ++i) s[i] = l[i + 8] + l[i];
  for (int i = 0; i < 4; ++i) u[i] = s[i + 4] + s[i];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

}  // namespace pdserve::cpu_internal

#endif  // PDSERVE_COMMON_BACKEND_CPU_ATTENTION_AVX2_H_
