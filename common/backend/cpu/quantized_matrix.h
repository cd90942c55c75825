// Weight matrices quantized to 8 or 4 bits for the CPU, and their matmul
// (AVX512-VNNI vpdpbusd, or AMX-INT8 tiles for products of many rows; AVX2
// or scalar code on CPUs without AVX-512). Weights
// W[n][k] = scale[g][n] * (u[n][k] - zero[g][n]) for k in group g (group_size
// consecutive k), u unsigned (0..255 or 0..15), scales stored as f16, zero
// points per (group, column) or one constant (symmetric: 128 or 8). Packed once
// into panels of 64 output columns, group-major; per group the codes of 4
// consecutive k of a column share a 32-bit lane (vpdpbusd's operand), int4 two
// codes per byte.
//
// Arithmetic (the same for any number of rows, their neighbours or the
// thread count: batch-invariant). Each activation row is quantized in blocks
// of 32 k that depend on that row only: s = max|x| / 127, q = round-half-
// even(x * (127 / max|x|)) in [-127, 127]. Then per block b in increasing k:
//   acc = fma(float(sum_k u*q - zero * sum_k q), scale * s, acc)
// where the integer sums are exact, so their order never matters.
// Immutable after packing; QuantMatMul is thread-safe.
#ifndef PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_MATRIX_H_
#define PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_MATRIX_H_

#include <cstdint>
#include <string>

#include "common/backend/cpu/packed_matrix.h"
#include "common/backend/thread_pool.h"
#include "common/model/quantization.h"

namespace pdserve {

class QuantizedMatrix {
 public:
  static constexpr int kPanel = 64;
  static constexpr int kBlock = 32;  // activation block (k)

  QuantizedMatrix() = default;
  // An all-zero [n][k] matrix; fill every row with QuantizeRow or SetCodes.
  // format.group_size: a multiple of 32 (K is padded to whole groups with
  // zero weights), 0 for one group per row; symmetric: zero point
  // 2^(bits-1) for every group, else one per (group, column).
  QuantizedMatrix(int64_t n, int64_t k, const QuantFormat& format);

  // The quantized values of one row as QuantizeRow would store them,
  // dequantized (for --dtype=f32 with --quantization).
  static void RoundTrip(const QuantFormat& format, int64_t k, const float* row,
                        float* out);

  // Quantizes row n from k floats: per group, symmetric scale = max|w| /
  // (2^(bits-1) - 1) rounded to f16, codes round-half-even(w / scale) +
  // zero; asymmetric: scale = (max - min) / (2^bits - 1), zero =
  // round(-min / scale) clamped to the code range.
  void QuantizeRow(int64_t n, const float* row);
  // Row n from given codes (k values in [0, 2^bits)), per-group scales
  // (exactly representable in f16, else rounded) and, when asymmetric,
  // per-group zero points (else the constant is used).
  void SetCodes(int64_t n, const uint8_t* codes, const float* scales,
                const uint8_t* zeros);
  // Dequantized row: scale * (u - zero), exact in f32.
  void GetRow(int64_t n, float* out) const;
  // Code, scale and zero point of one weight (tests).
  int Code(int64_t n, int64_t k) const;
  float Scale(int64_t n, int64_t group) const;
  int Zero(int64_t n, int64_t group) const;

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  const QuantFormat& format() const { return format_; }
  int64_t groups() const { return groups_; }
  int64_t bytes() const { return bytes_; }
  int64_t num_panels() const { return num_panels_; }
  const char* panel(int64_t p) const { return data_.get() + p * panel_bytes_; }
  // Byte layout of one group inside a panel.
  int64_t group_bytes() const { return group_bytes_; }
  int64_t code_bytes() const { return code_bytes_; }  // codes of one group

 private:
  char* GroupAt(int64_t n, int64_t g) const {
    return data_.get() + (n / kPanel) * panel_bytes_ + g * group_bytes_;
  }

  int64_t n_ = 0, k_ = 0, groups_ = 0, num_panels_ = 0;
  int64_t code_bytes_ = 0, group_bytes_ = 0, panel_bytes_ = 0, bytes_ = 0;
  QuantFormat format_;
  AlignedBuffer data_;
};

// y[m][0:n) = x[m][0:k) . W^T (+ bias), W quantized, per the arithmetic
// above; x rows ldx apart, y rows ldy apart. Threads split the panels.
void QuantMatMul(ThreadPool& pool, const float* x, int64_t M, int64_t ldx,
                 const QuantizedMatrix& w, const float* bias, float* y,
                 int64_t ldy);

// True when the VNNI kernel runs (else the scalar fallback, same bits).
bool CpuHasAvx512Vnni();

// QuantMatMul's kernels, all with the same bits. kAuto (the default) takes
// AMX-INT8 for products of 16 rows or more where the CPU has it, else VNNI
// where it has that, else AVX2 (quantized_avx2.h), else scalar code;
// PDSERVE_QUANT_KERNEL=amx|vnni|avx2|scalar forces one for the process.
enum class QuantKernel { kAuto, kScalar, kVnni, kAmx, kAvx2 };
// Forces a kernel for every later QuantMatMul in the process (tests,
// benchmarks); kAuto restores the default. False, and nothing changes,
// where this CPU cannot run it.
bool ForceQuantKernel(QuantKernel kernel);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_MATRIX_H_
