// How weights are quantized: the format a --quantization flag names or a
// GPTQ/AWQ checkpoint declares (bits, group size along K, symmetric or with
// zero points). Plain value; thread-compatible.
#ifndef PDSERVE_COMMON_MODEL_QUANTIZATION_H_
#define PDSERVE_COMMON_MODEL_QUANTIZATION_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve {

struct QuantFormat {
  int bits = 8;        // 8 or 4
  int group_size = 0;  // along K, a multiple of 32; 0 = one group per row
  bool symmetric = true;
  // The group size a flag without -gN / -pc means: int8 one group per
  // output channel (0), int4 groups of 128 (GPTQ's and AWQ's usual size).
  static int DefaultGroupSize(int bits) { return bits == 8 ? 0 : 128; }
  // "int8" (per output channel), "int8-g32" (the Q8_0 layout), "int4"
  // (groups of 128), "int4-g32" (the Q4_0 layout), "int4-asym", "int4-pc":
  // the flag's spelling, parsed back by ParseQuantization.
  std::string ToString() const;
  bool operator==(const QuantFormat& o) const {
    return bits == o.bits && group_size == o.group_size &&
           symmetric == o.symmetric;
  }
};

// Parses "none"/"" (nullopt) or int8|int4 with optional "-g32|-g64|-g128|
// -pc" (group size; default DefaultGroupSize: per channel for int8, 128
// for int4) and "-asym" (zero points; default symmetric): "int8",
// "int8-g32", "int4", "int4-g32", "int4-g32-asym".
absl::StatusOr<std::optional<QuantFormat>> ParseQuantization(
    absl::string_view text);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_QUANTIZATION_H_
