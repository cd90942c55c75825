#include "common/model/dtype.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pdserve {

int DTypeSize(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kI32 ? 4 : 2;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

absl::StatusOr<DType> ParseComputeDType(absl::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype '", name, "' (use f32 or bf16)"));
}

float F16ToF32(uint16_t v) {
  const uint32_t sign = (v >> 15) & 1u;
  const uint32_t exp = (v >> 10) & 0x1fu;
  const uint32_t mant = v & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    mag = mant ? std::nanf("") : INFINITY;
  } else {
    mag = std::ldexp(static_cast<float>(mant | 0x400u),
                     static_cast<int>(exp) - 25);
  }
  return sign ? -mag : mag;
}

void ConvertToF32(DType src_dtype, const void* src, int64_t n, float* dst) {
  switch (src_dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const char*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, s + 2 * i, 2);  // file data may be unaligned
        dst[i] = Bf16ToF32(v);
      }
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const char*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, s + 2 * i, 2);
        dst[i] = F16ToF32(v);
      }
      return;
    }
    case DType::kI32: {
      const auto* s = static_cast<const char*>(src);
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, s + 4 * i, 4);
        dst[i] = static_cast<float>(v);
      }
      return;
    }
  }
}

}  // namespace pdserve
