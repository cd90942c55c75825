// The AVX-512 panel kernels of MatMul (packed_matrix.h): f32 (one FMA per k
// in increasing k), bf16 with vdpbf16ps (AVX512-BF16) or emulated with two
// FMAs per pair, high half first, under MXCSR DAZ|FTZ set by the caller; all
// the same bits as the AVX2 and scalar paths. Stateless and thread-safe;
// call only when CpuHasAvx512() (kBf16Native: CpuHasAvx512Bf16()).
#ifndef PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_AVX512_H_
#define PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_AVX512_H_

#include <cstdint>

namespace pdserve::cpu_internal {

// Rows of x per micro-kernel call (6 x 4 zmm accumulators).
inline constexpr int kAvx512KernelRows = 6;

// What x holds: f32 rows (kF32), bf16 pair rows, one uint32 per pair
// (kBf16Native), or the pairs' halves widened to f32, high then low
// (kBf16Emulated).
enum class Avx512Mode { kF32, kBf16Native, kBf16Emulated };

// One panel of 64 output columns (`valid` of them real): y[m][0:valid) for
// m in [0, M). x has 4-byte entries, ldx of them per row; K in panel rows
// (k, or pairs of k).
void PanelAvx512(Avx512Mode mode, const void* x, int64_t M, int64_t ldx,
                 const char* panel, int64_t K, int valid, float* y,
                 int64_t ldy);

// Rounds n floats to bf16 pairs, 16 pairs per step (same bits as
// F32ToBf16; NaN made quiet).
void RoundToBf16PairsAvx512(const float* x, int64_t n, uint32_t* out);

}  // namespace pdserve::cpu_internal

#endif  // PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_AVX512_H_
