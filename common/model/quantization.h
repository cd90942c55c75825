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
  int bits = 8;         // 8 or 4
  int group_size = 32;  // along K, a multiple of 32; 0 = one group per row
  bool symmetric = true;
  // "int8", "int4-g128", "int4-asym", "int8-pc" (per output channel): the
  // flag's spelling, parsed back by ParseQuantization.
  std::string ToString() const;
  bool operator==(const QuantFormat& o) const {
    return bits == o.bits && group_size == o.group_size &&
           symmetric == o.symmetric;
  }
};

// Parses "none"/"" (nullopt) or int8|int4 with optional "-g32|-g64|-g128|
// -pc" (group size; default 32) and "-asym" (zero points; default
// symmetric): "int8", "int4", "int4-g128", "int4-g128-asym", "int8-pc".
absl::StatusOr<std::optional<QuantFormat>> ParseQuantization(
    absl::string_view text);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_QUANTIZATION_H_
