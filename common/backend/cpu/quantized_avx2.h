// The AVX2 kernel of QuantMatMul (quantized_matrix.h) for CPUs without
// AVX512-VNNI: each block's integer sum u*q formed exactly with 16-bit
// products (vpmaddwd; vpmaddubsw's 16-bit pair sums could saturate), then
// the documented float steps, so the same bits as the VNNI, AMX and scalar
// kernels. Stateless and thread-safe; call only when CpuHasAvx2().
#ifndef PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_AVX2_H_
#define PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_AVX2_H_

#include <cstdint>

#include "common/backend/cpu/quantized_amx.h"

namespace pdserve::cpu_internal {

// One panel, M rows, `valid` columns (QuantPanelArgs' masks are not used).
void QuantPanelAvx2(const QuantPanelArgs& a, int64_t M, int valid, int bits,
                    bool asym);

}  // namespace pdserve::cpu_internal

#endif  // PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_AVX2_H_
