// The AVX2 kernel of QuantMatMul (quantized_matrix.h) for CPUs without
// AVX512-VNNI: each block's integer sum u*q formed exactly (16-bit products
// with vpmaddwd; one row: vpmaddubsw on the activations' nibbles, whose
// 16-bit pair sums cannot saturate), then the documented float steps, so
// the same bits as the VNNI, AMX and scalar kernels; and the activations'
// quantization with the scalar one's arithmetic. Stateless and
// thread-safe; call only when CpuHasAvx2().
#ifndef PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_AVX2_H_
#define PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_AVX2_H_

#include <cstdint>

#include "common/backend/cpu/quantized_amx.h"

namespace pdserve::cpu_internal {

// One row x[0, k) into `blocks` blocks of 32 codes (zeros past k), each
// block's scale and code sum: QuantizeRowScalar's results, vectorized.
void QuantizeRowAvx2(const float* x, int64_t k, int64_t blocks, int8_t* q,
                     float* scale, int32_t* sum);

// One panel, M rows, `valid` columns (QuantPanelArgs' masks are not used).
void QuantPanelAvx2(const QuantPanelArgs& a, int64_t M, int valid, int bits,
                    bool asym);

}  // namespace pdserve::cpu_internal

#endif  // PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_AVX2_H_
