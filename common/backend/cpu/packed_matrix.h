// Weight matrices packed once for the CPU matmul kernel, and the kernel.
// W is given in Hugging Face layout [N out][K in] (one or several parts
// stacked along N, e.g. q|k|v) and packed into panels of 64 output columns,
// k-major: panel p holds, for each k, the 64 weights W[p*64 .. p*64+63][k]
// (bf16: as 32-bit lanes pairing column c and c+16). MatMul computes
// y[m][n] = sum_k x[m][k] * W[n][k] by broadcasting x[m][k] against a panel
// row: every output element accumulates with one FMA per k in increasing k
// from 0, whatever the number of rows or their neighbours, so results are
// batch-invariant by construction. Threads split N (chunks of panels taken
// from a shared counter), never K.
// Immutable after packing; MatMul is thread-safe.
#ifndef PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_H_
#define PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/backend/thread_pool.h"
#include "common/model/dtype.h"
#include "common/model/model_source.h"

namespace pdserve {

// 64-byte aligned heap buffer.
struct AlignedFree {
  void operator()(void* p) const;
};
using AlignedBuffer = std::unique_ptr<char[], AlignedFree>;
AlignedBuffer AllocateAligned(int64_t bytes);

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

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_PACKED_MATRIX_H_
