// Row-wise CPU kernels of the transformer: RMSNorm, RoPE (HF rotate_half),
// SwiGLU and KV row conversion (attention is in attention.h). Each function
// computes one row wholly, in a fixed order that does not depend on the
// batch: the source of batch invariance besides MatMul. Pure functions;
// thread-safe.
#ifndef PDSERVE_COMMON_BACKEND_CPU_KERNELS_H_
#define PDSERVE_COMMON_BACKEND_CPU_KERNELS_H_

#include <cstdint>
#include <vector>

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

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_KERNELS_H_
