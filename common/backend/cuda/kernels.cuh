// CUDA kernels of the transformer forward pass (everything but the matrix
// products, which go to cuBLAS): embedding gather, RMSNorm, RoPE fused with
// the paged KV store, SiLU*mul, residual/bias adds, dtype conversion, tiled
// (flash-style, online softmax) attention over the paged KV pool and a row
// argmax. Host-callable launchers only (no abseil, no gRPC): this header is
// included by nvcc-compiled and g++-compiled code alike. Every launcher is
// asynchronous on `stream` and returns the launch's cudaError_t. Stateless;
// thread-safe as CUDA launches are.
//
// NOT YET RUN ON A GPU: these kernels compile with nvcc 13.0 for sm_90 but
// have only been reviewed, never executed (tests/unit/cuda_kernels_test.cc
// checks them against the CPU kernels when a GPU is present).
//
// Shapes below: T = tokens in the pass, H = hidden size, V = vocab, D =
// head_dim, Q = num_heads * D, KVD = num_kv_heads * D, NQKV = Q + 2 * KVD.
#ifndef PDSERVE_COMMON_BACKEND_CUDA_KERNELS_CUH_
#define PDSERVE_COMMON_BACKEND_CUDA_KERNELS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace pdserve {
namespace cuda {

// The device KV pool: byte-for-byte the layout of the host KvCache
// (common/kv/kv_cache.h), so block ids and the KV wire format carry over.
// Row `offset` of K (kv = 0) or V (kv = 1) of physical block `block` in layer
// `layer` starts at element
//   (((block * num_layers + layer) * 2 + kv) * block_size + offset) * kvd.
struct KvPoolView {
  void* base = nullptr;  // [blocks][layers][2][block_size][kvd] in f32 or bf16
  int num_layers = 0;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
  bool bf16 = false;  // element type of the pool: bf16 (true) or f32
};

// out[t][:] = table[tokens[t]][:] as f32.
// table: [V][H] (f32 when !table_bf16, else bf16 bits); tokens: [T];
// out: [T][H].
cudaError_t EmbeddingGather(const void* table, bool table_bf16,
                            const int32_t* tokens, int T, int H, float* out,
                            cudaStream_t stream);

// out[r][:] = weight * (x[src_r][:] * rsqrt(mean(x[src_r]^2) + eps)) as
// transformers' LlamaRMSNorm (sum of squares accumulated in double, as the CPU
// kernel), src_r = rows ? rows[r] : r.
// x: [*][H] (rows ld_x apart); rows: [R] or nullptr; weight: [H];
// out: [R][H] (rows H apart).
cudaError_t RmsNorm(const float* x, int64_t ld_x, const int32_t* rows, int R,
                    int H, const float* weight, float eps, float* out,
                    cudaStream_t stream);

// Per token t: RoPE (HF rotate_half) in place on the num_heads q heads and the
// num_kv_heads k heads of qkv[t] with angle = float(positions[t] * inv_freq[i])
// and cos/sin evaluated in double then rounded (as the CPU's RopeAngles); then
// stores k and v of token t into the pool at layer `layer`, block
// block_ids[t], row block_offsets[t] (bf16 pools round to nearest even).
// qkv: [T][NQKV] (q | k | v); positions, block_ids, block_offsets: [T];
// inv_freq: [D/2].
cudaError_t RopeAndStoreKv(float* qkv, const int32_t* positions,
                           const int32_t* block_ids,
                           const int32_t* block_offsets, int T, int num_heads,
                           const float* inv_freq, KvPoolView pool, int layer,
                           cudaStream_t stream);

// out[t][i] = silu(gu[t][i]) * gu[t][I + i].
// gu: [T][2I] (gate | up); out: [T][I].
cudaError_t SiluMul(const float* gu, int T, int I, float* out,
                    cudaStream_t stream);

// x[i] += y[i] for i < n.  x, y: [n].
cudaError_t AddInPlace(float* x, const float* y, int64_t n,
                       cudaStream_t stream);

// y[m][j] += bias[j].  y: [M][N] (rows ld_y apart); bias: [N].
cudaError_t AddBias(float* y, int64_t ld_y, const float* bias, int M, int N,
                    cudaStream_t stream);

// dst[i] = bf16(src[i]) (round to nearest even).
// src: [n] f32; dst: [n] bf16 bits.
cudaError_t F32ToBf16(const float* src, int64_t n, uint16_t* dst,
                      cudaStream_t stream);

// One attention work tile: `rows` consecutive query rows [row0, row0 + rows)
// of the pass, all of one sequence, at positions pos0, pos0 + 1, ...; the
// sequence's block table is block_tables[table_offset ...].
struct AttentionTile {
  int32_t row0;
  int32_t rows;  // 1 .. kAttentionRowsPerTile
  int32_t pos0;
  int32_t table_offset;
};
constexpr int kAttentionRowsPerTile = 8;  // one warp per query row

// Decode rows (tiles of one row) whose context is longer than
// kAttentionSplitKeys are split along the keys (flash-decoding): one CTA
// per (tile, head, split of kAttentionSplitKeys positions) writes a partial
// (max, sum, unnormalized output) and a second kernel combines a row's
// splits in increasing order. Without it a decode step runs one CTA per
// head whatever the context (32 CTAs on a 132-SM H200 for Llama-3-8B),
// walking the context serially: 0.2x the context-16 step rate at context
// 2048 (docs/performance.md, "CUDA"). The splits of a row depend only on
// its position, so a decode row's result still does not depend on its
// batch; rows of multi-row (prefill) tiles are never split.
constexpr int kAttentionSplitKeys = 256;  // a multiple of the 32-key tile

// Which tiles are split (PlanAttentionSplits, below) and where their
// partials go: base[i] is the first partial slot of tile i (slots base[i] ..
// base[i] + splits - 1, each num_heads x (head_dim + 2) floats), or -1 for
// a tile computed whole.
struct AttentionSplitPlan {
  std::vector<int32_t> base;
  int64_t slots = 0;   // partial slots in all
  int max_splits = 1;  // the grid's third dimension
};

// Causal GQA attention of every query row over its sequence's paged KV
// (positions [max(0, pos - window + 1), pos], or [0, pos] when window == 0),
// which RopeAndStoreKv has already written for this pass. One CTA per (tile,
// q head[, key split]): key/value tiles of 32 positions are staged once in
// shared memory for all the tile's rows (flash-style, online softmax in f32,
// keys visited in increasing position order: the result of a row does not
// depend on the other rows of its tile or batch). Decode rows are tiles of
// one row, split along the keys as `split_base` says (device copy of
// PlanAttentionSplits(tiles, split_keys).base; nullptr: nothing split) into
// `partial` (plan.slots * num_heads * (head_dim + 2) floats).
// qkv: [T][NQKV] (q read from columns [0, Q)); tiles: [num_tiles];
// block_tables: [sum of table lengths]; out: [T][Q]. head_dim <= 256.
cudaError_t Attention(const float* qkv, int nqkv, const AttentionTile* tiles,
                      int num_tiles, const int32_t* block_tables,
                      KvPoolView pool, int layer, int num_heads, int window,
                      float scale, float* out, cudaStream_t stream,
                      const int32_t* split_base = nullptr, int max_splits = 1,
                      int split_keys = kAttentionSplitKeys,
                      float* partial = nullptr);

inline AttentionSplitPlan PlanAttentionSplits(
    const std::vector<AttentionTile>& tiles, int split_keys) {
  AttentionSplitPlan plan;
  plan.base.assign(tiles.size(), -1);
  if (split_keys <= 0) return plan;
  for (size_t i = 0; i < tiles.size(); ++i) {
    const AttentionTile& t = tiles[i];
    if (t.rows != 1 || t.pos0 < split_keys) continue;
    const int splits = t.pos0 / split_keys + 1;
    plan.base[i] = static_cast<int32_t>(plan.slots);
    plan.slots += splits;
    plan.max_splits = std::max(plan.max_splits, splits);
  }
  return plan;
}

// out[r] = argmax_j logits[r][j] (lowest index on ties).
// logits: [R][V]; out: [R].
cudaError_t ArgmaxRows(const float* logits, int R, int V, int32_t* out,
                       cudaStream_t stream);

}  // namespace cuda
}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CUDA_KERNELS_CUH_
