// Weight matrices packed once for the CPU matmul kernel, and the kernel.
// W is given in Hugging Face layout [N out][K in] (one or several parts
// stacked along N, e.g. q|k|v) and packed into panels of 64 output columns,
// k-major. f32: panel p holds, for each k, the 64 weights W[p*64 + c][k].
// bf16: for each pair of k (2j, 2j+1), 64 32-bit lanes (W[c][2j] in the low
// half, W[c][2j+1] in the high half), the operand layout of AVX512-BF16's
// vdpbf16ps.
//
// Arithmetic of y[m][n] = sum_k x[m][k] * W[n][k], the same for any number of
// rows, their neighbours or the thread count (batch invariance):
// - f32: one FMA per k, k increasing from 0.
// - bf16: x[m][k] is first rounded to bf16 (nearest even); then per pair j in
//   increasing order acc += x[2j+1]*W[2j+1] followed by acc += x[2j]*W[2j],
//   each product exact in f32 and each sum rounded to f32 (nearest even),
//   with bf16/f32 subnormal inputs read as zero and subnormal sums flushed to
//   zero: vdpbf16ps' definition. CPUs without AVX512-BF16 compute exactly
//   that with two FMAs per pair under MXCSR DAZ|FTZ (AVX-512F, or AVX2:
//   packed_matrix_avx2.h) or in scalar code; CPUs with it too, where the FMAs
//   are faster (UseVdpbf16ps).
// Threads split N (chunks of panels from a shared counter), never K.
// Immutable after packing; MatMul is thread-safe.
#ifndef PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_H_
#define PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/backend/cpu/aligned_buffer.h"
#include "common/backend/thread_pool.h"
#include "common/model/dtype.h"
#include "common/model/model_source.h"

namespace pdserve {

class PackedMatrix {
 public:
  static constexpr int kPanel = 64;

  PackedMatrix() = default;
  // An all-zero [n][k] matrix in `dtype` (f32 or bf16), to fill with
  // PackRows; parts (e.g. q, k, v) are stacked along N.
  PackedMatrix(int64_t n, int64_t k, DType dtype);
  // Packs `part` ([rows][k], any file dtype) as rows [row0, row0 + rows);
  // bf16 rounds to nearest even.
  void PackRows(int64_t row0, const WeightView& part);
  // Row n (output column) from k f32 values (bf16: rounded to nearest even).
  void SetRow(int64_t n, const float* row);

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  DType dtype() const { return dtype_; }
  int64_t bytes() const { return bytes_; }
  // W[row][:] as f32 (e.g. an embedding row of a tied lm_head).
  void GetRow(int64_t row, float* out) const;

  const char* panel(int64_t p) const { return data_.get() + p * panel_bytes_; }
  int64_t num_panels() const { return num_panels_; }

 private:
  int64_t n_ = 0, k_ = 0, num_panels_ = 0, panel_bytes_ = 0, bytes_ = 0;
  DType dtype_ = DType::kF32;
  AlignedBuffer data_;
};

// y[m][0:n) = x[m][0:k) . W^T (+ bias) for m in [0, M); x rows ldx apart, y
// rows ldy apart. Threads split the panels.
void MatMul(ThreadPool& pool, const float* x, int64_t M, int64_t ldx,
            const PackedMatrix& w, const float* bias, float* y, int64_t ldy);

// True when the AVX-512 kernels run on this CPU (else the scalar fallback).
bool CpuHasAvx512();
// True when the CPU has AVX2 and FMA (PDSERVE_DISABLE_AVX2 unset): without
// AVX-512, the matmul runs its AVX2 kernel (same bits) instead of scalar code.
bool CpuHasAvx2();
// True when the CPU has vdpbf16ps (AVX512-BF16).
bool CpuHasAvx512Bf16();
// True when bf16 products of `rows` rows of x use vdpbf16ps, else its
// emulation (same bits): vdpbf16ps where the CPU has it and, timed once on
// first use for decode-sized (< 6 rows) and for larger products, it is the
// faster of the two here; PDSERVE_BF16_KERNEL=vdpbf16ps|fma forces one.
bool UseVdpbf16ps(int64_t rows);
// True when every bf16 product of this process runs on AMX tiles
// (bf16_amx.h): only when asked (PDSERVE_BF16_KERNEL=amx) and the CPU has
// AMX-BF16. Its sums differ from vdpbf16ps' definition, so the bits then
// depend on the CPU (the engine's fingerprint says so).
bool UseAmxBf16();

// Rounds n floats to bf16 (nearest even, as F32ToBf16) into pairs: out[j]
// holds bf16(x[2j]) in its low and bf16(x[2j+1]) in its high half (0 past
// n). (n + 1) / 2 words.
void RoundToBf16Pairs(const float* x, int64_t n, uint32_t* out);

// One bf16 pair product step as vdpbf16ps defines it (for tests and the
// scalar fallback): acc + a.hi*b.hi, then + a.lo*b.lo, DAZ/FTZ.
float Bf16PairDot(float acc, uint32_t a, uint32_t b);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_H_
