// Element types of weights, activations and the KV cache, and conversions
// between them (bf16 from f32 by round-to-nearest-even). Pure functions.
#ifndef PDSERVE_COMMON_MODEL_DTYPE_H_
#define PDSERVE_COMMON_MODEL_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve {

// kF32 and kBF16 are compute/KV dtypes; kF16 and kI32 (GPTQ/AWQ packed
// codes) only appear in files.
enum class DType { kF32, kBF16, kF16, kI32 };

int DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "f32", "bf16", "f16"
// Parses "f32"/"float32", "bf16"/"bfloat16" (compute dtypes only).
absl::StatusOr<DType> ParseComputeDType(absl::string_view name);

inline float Bf16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even; NaN stays a (quiet) NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x0040u;
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float RoundToBf16(float f) { return Bf16ToF32(F32ToBf16(f)); }

float F16ToF32(uint16_t v);

// Converts `n` elements of `src` (in `src_dtype`) to f32.
void ConvertToF32(DType src_dtype, const void* src, int64_t n, float* dst);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_DTYPE_H_
