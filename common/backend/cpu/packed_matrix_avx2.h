// The AVX2+FMA panel kernel of MatMul (packed_matrix.h), for x86-64 CPUs
// without AVX-512 (AMD Zen 2/3, most laptops before 2023): the same
// per-element chain of FMAs as the AVX-512 kernels and the scalar code (one
// FMA per k in increasing k for f32; two per bf16 pair, high half first,
// under MXCSR DAZ|FTZ set by the caller), so the same bits on every CPU.
// Stateless and thread-safe; call only when CpuHasAvx2().
#ifndef PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_AVX2_H_
#define PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_AVX2_H_

#include <cstdint>

namespace pdserve::cpu_internal {

// One panel of 64 output columns (`valid` of them real): y[m][0:valid) for
// m in [0, M). f32: x is M rows of K floats, ldx floats apart. bf16: x is
// the rows' bf16 pairs widened to f32, high half then low half per pair
// (2K floats per row, ldx floats apart), K is the number of pairs.
void PanelAvx2(bool bf16, const float* x, int64_t M, int64_t ldx,
               const char* panel, int64_t K, int valid, float* y, int64_t ldy);

}  // namespace pdserve::cpu_internal

#endif  // PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_AVX2_H_
