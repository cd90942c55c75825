// CUDA kernels; see kernels.cuh. NOT YET RUN ON A GPU (compiled only).
//
// Arithmetic follows the CPU kernels (common/backend/cpu/kernels.cc) where it
// matters for agreement: RMSNorm sums squares in double, RoPE angles are a
// float product with cos/sin in double, rotations use explicitly rounded
// multiplies and adds (no FMA contraction). Reductions use fixed trees, so a
// row's result never depends on the other rows of the launch.
#include <cuda_bf16.h>

#include <cmath>

#include "common/backend/cuda/kernels.cuh"

namespace pdserve {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float LoadElem(const void* base, int64_t i,
                                          bool bf16) {
  if (bf16) {
    const uint16_t bits = static_cast<const uint16_t*>(base)[i];
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  }
  return static_cast<const float*>(base)[i];
}

// Round-to-nearest-even as common/model/dtype.h's F32ToBf16 (NaN -> quiet).
__device__ __forceinline__ uint16_t ToBf16Bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x0040u;
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

__global__ void EmbeddingGatherKernel(const void* table, bool bf16,
                                      const int32_t* tokens, int H,
                                      float* out) {
  const int t = blockIdx.x;
  const int64_t src = static_cast<int64_t>(tokens[t]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    out[static_cast<int64_t>(t) * H + i] = LoadElem(table, src + i, bf16);
  }
}

__global__ void RmsNormKernel(const float* x, int64_t ld_x, const int32_t* rows,
                              int H, const float* weight, float eps,
                              float* out) {
  __shared__ double partial[kThreads];
  const int r = blockIdx.x;
  const float* xr = x + (rows ? rows[r] : r) * ld_x;
  double sum = 0.0;
  for (int i = threadIdx.x; i < H; i += kThreads) {
    sum += static_cast<double>(xr[i]) * xr[i];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float variance = static_cast<float>(partial[0] / H);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(variance, eps)));
  float* o = out + static_cast<int64_t>(r) * H;
  for (int i = threadIdx.x; i < H; i += kThreads) {
    o[i] = __fmul_rn(weight[i], __fmul_rn(xr[i], inv));
  }
}

__global__ void RopeAndStoreKvKernel(float* qkv, const int32_t* positions,
                                     const int32_t* block_ids,
                                     const int32_t* block_offsets,
                                     int num_heads, const float* inv_freq,
                                     KvPoolView pool, int layer) {
  const int t = blockIdx.x;
  const int D = pool.head_dim, half = D / 2;
  const int kvd = pool.num_kv_heads * D;
  const int nqkv = num_heads * D + 2 * kvd;
  float* row = qkv + static_cast<int64_t>(t) * nqkv;
  const float pos = static_cast<float>(positions[t]);
  const int pairs = (num_heads + pool.num_kv_heads) * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int h = p / half, i = p % half;
    const float angle = __fmul_rn(pos, inv_freq[i]);
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    const float s = static_cast<float>(sin(static_cast<double>(angle)));
    float* v = row + h * D;  // k heads follow the q heads directly
    const float x1 = v[i], x2 = v[i + half];
    v[i] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(-x2, s));
    v[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  }
  __syncthreads();
  const int64_t block = block_ids[t];
  const int64_t k_row =
      ((block * pool.num_layers + layer) * 2 + 0) * pool.block_size +
      block_offsets[t];
  const int64_t v_row = k_row + pool.block_size;
  const float* k = row + num_heads * D;
  const float* v = k + kvd;
  for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
    if (pool.bf16) {
      uint16_t* base = static_cast<uint16_t*>(pool.base);
      base[k_row * kvd + i] = ToBf16Bits(k[i]);
      base[v_row * kvd + i] = ToBf16Bits(v[i]);
    } else {
      float* base = static_cast<float*>(pool.base);
      base[k_row * kvd + i] = k[i];
      base[v_row * kvd + i] = v[i];
    }
  }
}

__global__ void SiluMulKernel(const float* gu, int I, float* out) {
  const int t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= I) return;
  const float g = gu[static_cast<int64_t>(t) * 2 * I + i];
  const float u = gu[static_cast<int64_t>(t) * 2 * I + I + i];
  out[static_cast<int64_t>(t) * I + i] =
      __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

__global__ void AddInPlaceKernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void AddBiasKernel(float* y, int64_t ld_y, const float* bias,
                              int N) {
  const int m = blockIdx.y;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < N) y[m * ld_y + j] = __fadd_rn(y[m * ld_y + j], bias[j]);
}

__global__ void F32ToBf16Kernel(const float* src, int64_t n, uint16_t* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = ToBf16Bits(src[i]);
}

constexpr int kKeyTile = 32;
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  return v;
}

// Shared memory: K tile [32][D + 1] (padded: lanes read different rows), V
// tile [32][D], q rows [8][D]; all f32.
__global__ void AttentionKernel(const float* qkv, int nqkv,
                                const AttentionTile* tiles,
                                const int32_t* block_tables, KvPoolView pool,
                                int layer, int num_heads, int window,
                                float scale, float* out,
                                const int32_t* split_base, int split_keys,
                                float* partial) {
  extern __shared__ float smem[];
  const int D = pool.head_dim;
  float* ks = smem;
  float* vs = ks + kKeyTile * (D + 1);
  float* qs = vs + kKeyTile * D;
  const AttentionTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y;
  const int z = blockIdx.z;  // key split (split tiles only)
  const int split = split_base != nullptr ? split_base[blockIdx.x] : -1;
  if (split < 0 && z > 0) return;
  const int kvh = h / (num_heads / pool.num_kv_heads);
  const int kvd = pool.num_kv_heads * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = block_tables + tile.table_offset;

  for (int i = threadIdx.x; i < tile.rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    qs[i] = qkv[static_cast<int64_t>(tile.row0 + r) * nqkv + h * D + d];
  }
  const bool active = warp < tile.rows;
  const int pos = tile.pos0 + warp;
  const int first = window > 0 ? max(0, pos - window + 1) : 0;
  const int klast = tile.pos0 + tile.rows - 1;
  const int kfirst = window > 0 ? max(0, tile.pos0 - window + 1) : 0;
  float acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  // Key tiles start at multiples of 32 (absolute positions), so a row sees
  // the same tiles in the same order whatever tile or batch it is in. A
  // split CTA visits its split's positions [z * split_keys, ...) only.
  int k_begin = (kfirst / kKeyTile) * kKeyTile, k_end = klast;
  if (split >= 0) {
    const int lo = z * split_keys;
    if (lo > klast) return;  // beyond this row's context (CTA-uniform)
    k_begin = max(k_begin, lo);
    k_end = min(k_end, lo + split_keys - 1);
  }
  for (int k0 = k_begin; k0 <= k_end; k0 += kKeyTile) {
    __syncthreads();  // previous tile consumed (and q staged)
    for (int i = threadIdx.x; i < kKeyTile * D; i += blockDim.x) {
      const int j = i / D, d = i % D;
      const int p = k0 + j;
      float kv_k = 0.0f, kv_v = 0.0f;
      if (p <= klast) {
        const int64_t block = table[p / pool.block_size];
        const int64_t k_row =
            ((block * pool.num_layers + layer) * 2) * pool.block_size +
            p % pool.block_size;
        const int64_t v_row = k_row + pool.block_size;
        kv_k = LoadElem(pool.base, k_row * kvd + kvh * D + d, pool.bf16);
        kv_v = LoadElem(pool.base, v_row * kvd + kvh * D + d, pool.bf16);
      }
      ks[j * (D + 1) + d] = kv_k;
      vs[j * D + d] = kv_v;
    }
    __syncthreads();
    if (!active) continue;
    const int p = k0 + lane;
    const bool valid = p >= first && p <= pos;
    float s = -INFINITY;
    if (valid) {
      const float* q = qs + warp * D;
      const float* k = ks + lane * (D + 1);
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot = fmaf(q[d], k[d], dot);
      s = dot * scale;
    }
    const float m_new = fmaxf(m, WarpMax(s));
    if (m_new == -INFINITY) continue;  // nothing visible yet (warp-uniform)
    const float corr = expf(m - m_new);
    const float pr = valid ? expf(s - m_new) : 0.0f;
    l = l * corr + WarpSum(pr);
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] *= corr;
    for (int j = 0; j < kKeyTile; ++j) {
      const float pj = __shfl_sync(~0u, pr, j);
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < D) acc[i] = fmaf(pj, vs[j * D + d], acc[i]);
      }
    }
    m = m_new;
  }
  if (!active) return;
  if (split >= 0) {  // a partial for AttentionCombineKernel (one row)
    float* part =
        partial + (static_cast<int64_t>(split + z) * num_heads + h) * (D + 2);
    if (lane == 0) {
      part[0] = m;
      part[1] = l;
    }
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) part[2 + d] = acc[i];
    }
    return;
  }
  const float inv = 1.0f / l;
  float* o =
      out + static_cast<int64_t>(tile.row0 + warp) * num_heads * D + h * D;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < D) o[d] = acc[i] * inv;
  }
}

// One warp per (split tile, head): the row's partials combined in increasing
// split order (empty splits, l == 0, skipped), then normalized as the
// unsplit kernel normalizes.
__global__ void AttentionCombineKernel(const AttentionTile* tiles,
                                       const int32_t* split_base,
                                       int split_keys, int num_heads, int D,
                                       const float* partial, float* out) {
  const int split = split_base[blockIdx.x];
  if (split < 0) return;
  const AttentionTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y, lane = threadIdx.x;
  const int n = tile.pos0 / split_keys + 1;
  auto part = [&](int z) {
    return partial +
           (static_cast<int64_t>(split + z) * num_heads + h) * (D + 2);
  };
  float m = -INFINITY;
  for (int z = 0; z < n; ++z) {
    if (part(z)[1] > 0.0f) m = fmaxf(m, part(z)[0]);
  }
  float l = 0.0f, acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] = 0.0f;
  for (int z = 0; z < n; ++z) {
    const float* p = part(z);
    if (!(p[1] > 0.0f)) continue;
    const float c = expf(p[0] - m);
    l = fmaf(p[1], c, l);
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) acc[i] = fmaf(p[2 + d], c, acc[i]);
    }
  }
  const float inv = 1.0f / l;
  float* o = out + static_cast<int64_t>(tile.row0) * num_heads * D + h * D;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < D) o[d] = acc[i] * inv;
  }
}

__global__ void ArgmaxKernel(const float* logits, int V, int32_t* out) {
  __shared__ float best_v[kThreads];
  __shared__ int32_t best_i[kThreads];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * V;
  float bv = -INFINITY;
  int32_t bi = -1;
  for (int j = threadIdx.x; j < V; j += kThreads) {
    if (bi < 0 || row[j] > bv) {  // j increases: first max kept on ties
      bv = row[j];
      bi = j;
    }
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const int32_t oi = best_i[threadIdx.x + s];
      const int32_t mi = best_i[threadIdx.x];
      if (oi >= 0 && (mi < 0 || ov > best_v[threadIdx.x] ||
                      (ov == best_v[threadIdx.x] && oi < mi))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best_i[0];
}

unsigned Blocks(int64_t n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace

cudaError_t EmbeddingGather(const void* table, bool table_bf16,
                            const int32_t* tokens, int T, int H, float* out,
                            cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  EmbeddingGatherKernel<<<T, kThreads, 0, stream>>>(table, table_bf16, tokens,
                                                    H, out);
  return cudaGetLastError();
}

cudaError_t RmsNorm(const float* x, int64_t ld_x, const int32_t* rows, int R,
                    int H, const float* weight, float eps, float* out,
                    cudaStream_t stream) {
  if (R == 0) return cudaSuccess;
  RmsNormKernel<<<R, kThreads, 0, stream>>>(x, ld_x, rows, H, weight, eps, out);
  return cudaGetLastError();
}

cudaError_t RopeAndStoreKv(float* qkv, const int32_t* positions,
                           const int32_t* block_ids,
                           const int32_t* block_offsets, int T, int num_heads,
                           const float* inv_freq, KvPoolView pool, int layer,
                           cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  RopeAndStoreKvKernel<<<T, 128, 0, stream>>>(qkv, positions, block_ids,
                                              block_offsets, num_heads,
                                              inv_freq, pool, layer);
  return cudaGetLastError();
}

cudaError_t SiluMul(const float* gu, int T, int I, float* out,
                    cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  SiluMulKernel<<<dim3(Blocks(I, kThreads), T), kThreads, 0, stream>>>(gu, I,
                                                                       out);
  return cudaGetLastError();
}

cudaError_t AddInPlace(float* x, const float* y, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddInPlaceKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t AddBias(float* y, int64_t ld_y, const float* bias, int M, int N,
                    cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  AddBiasKernel<<<dim3(Blocks(N, kThreads), M), kThreads, 0, stream>>>(y, ld_y,
                                                                       bias, N);
  return cudaGetLastError();
}

cudaError_t F32ToBf16(const float* src, int64_t n, uint16_t* dst,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  F32ToBf16Kernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(src, n, dst);
  return cudaGetLastError();
}

cudaError_t Attention(const float* qkv, int nqkv, const AttentionTile* tiles,
                      int num_tiles, const int32_t* block_tables,
                      KvPoolView pool, int layer, int num_heads, int window,
                      float scale, float* out, cudaStream_t stream,
                      const int32_t* split_base, int max_splits, int split_keys,
                      float* partial) {
  if (num_tiles == 0) return cudaSuccess;
  if (split_base != nullptr &&
      (split_keys <= 0 || split_keys % kKeyTile != 0 || partial == nullptr ||
       max_splits < 1 || max_splits > 65535)) {
    return cudaErrorInvalidValue;
  }
  if (split_base == nullptr) max_splits = 1;
  if (pool.head_dim > 32 * kMaxDimsPerLane || pool.num_kv_heads <= 0 ||
      num_heads % pool.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const int D = pool.head_dim;
  const size_t smem = sizeof(float) * (kKeyTile * (D + 1) + kKeyTile * D +
                                       kAttentionRowsPerTile * D);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  AttentionKernel<<<dim3(num_tiles, num_heads, max_splits),
                    32 * kAttentionRowsPerTile, smem, stream>>>(
      qkv, nqkv, tiles, block_tables, pool, layer, num_heads, window, scale,
      out, split_base, split_keys, partial);
  if (split_base == nullptr) return cudaGetLastError();
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  AttentionCombineKernel<<<dim3(num_tiles, num_heads), 32, 0, stream>>>(
      tiles, split_base, split_keys, num_heads, D, partial, out);
  return cudaGetLastError();
}

cudaError_t ArgmaxRows(const float* logits, int R, int V, int32_t* out,
                       cudaStream_t stream) {
  if (R == 0) return cudaSuccess;
  ArgmaxKernel<<<R, kThreads, 0, stream>>>(logits, V, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace pdserve
