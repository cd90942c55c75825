// Row-wise CPU kernels of the transformer: RMSNorm, RoPE (HF rotate_half),
// SwiGLU, KV stores and paged attention. Each function computes one row (or
// one (row, head)) wholly, in a fixed order that does not depend on the batch:
// the source of batch invariance besides MatMul. Pure functions; thread-safe.
#ifndef PDSERVE_COMMON_BACKEND_CPU_KERNELS_H_
#define PDSERVE_COMMON_BACKEND_CPU_KERNELS_H_

#include <cstdint>
#include <vector>

#include "common/kv/kv_cache.h"
#include "common/model/dtype.h"

namespace pdserve {

// out = weight * (x * rsqrt(mean(x^2) + eps)), as transformers' LlamaRMSNorm.
void RmsNorm(const float* x, const float* weight, int n, float eps, float* out);

// cos/sin of position * inv_freq for i < head_dim / 2.
void RopeAngles(const std::vector<float>& inv_freq, int64_t position,
                float* cos_out, float* sin_out);
// In place on `num_heads` consecutive heads: x*cos + rotate_half(x)*sin.
void ApplyRope(float* x, int num_heads, int head_dim, const float* cos,
               const float* sin);

// out[i] = silu(gate[i]) * up[i].
void SiluMul(const float* gate, const float* up, int n, float* out);

// Stores n floats as `dtype` (bf16: round to nearest even).
void StoreRow(const float* src, int n, DType dtype, char* dst);

// Attention of one query head over the paged cache: positions [first, last]
// of the sequence whose block table is `table`, kv head `kv_head`, in
// increasing position order. `scores` has room for last - first + 1 floats.
struct AttentionArgs {
  const KvCache* kv;
  const std::vector<int32_t>* table;
  int layer;
  int kv_head;
  int head_dim;
  int first;
  int last;
  float scale;
};
void AttendHead(const AttentionArgs& args, const float* q, float* scores,
                float* out);

// One query of AttendHeads: positions [first, last], `scores` with room for
// last - first + 1 floats, `out` head_dim floats.
struct AttentionQuery {
  const float* q;
  int first;
  int last;
  float* scores;
  float* out;
};
// AttendHead for n queries that share args' sequence (table), layer and kv
// head (args.first/last are ignored): tiles of AttentionTileRows(head_dim)
// queries share their K and V loads. Each query's result is bit-identical to
// AttendHead alone (same arithmetic in the same order), whatever its
// tile-mates.
void AttendHeads(const AttentionArgs& args, const AttentionQuery* queries,
                 int n);
// How many queries AttendHeads computes together (callers group that many).
int AttentionTileRows(int head_dim);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_KERNELS_H_
