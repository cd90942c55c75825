// Pre-quantized checkpoints as users download them: GPTQ (quant_method
// "gptq": bits 4 or 8, any group_size including -1, desc_act with g_idx, sym
// or not, checkpoint_format "gptq" or "gptq_v2") and AWQ (quant_method "awq",
// version "gemm", 4 bits, zero_point) safetensors. Reads config.json's
// quantization_config (or, where it has none, AutoGPTQ's
// quantize_config.json or AutoAWQ's quant_config.json) and unpacks one linear
// layer's qweight / qzeros / scales (/ g_idx) into plain codes, scales and zero
// points, following the published bit orders:
// - GPTQ: qweight int32 [in * bits / 32][out], packed along `in`: element t
//   of a word (bits [t*bits, (t+1)*bits)) is input row word * 32/bits + t;
//   qzeros int32 [groups][out * bits / 32] packed the same way along `out`,
//   holding zero - 1 ("gptq", AutoGPTQ v1) or the zero ("gptq_v2"); scales
//   [groups][out]; g_idx int32 [in] (group of each input; k / group_size
//   without act-order).
// - AWQ gemm: qweight int32 [in][out / 8] and qzeros int32 [groups][out / 8]
//   packed along `out` in the order [0, 2, 4, 6, 1, 3, 5, 7] (nibble t holds
//   column word * 8 + order[t]); scales [groups][out]; group = k / group_size.
// W[n][k] = scale[g][n] * (code[n][k] - zero[g][n]), g = g_idx[k].
// Pure functions over an open Checkpoint; thread-compatible.
#ifndef PDSERVE_COMMON_MODEL_QUANTIZED_CHECKPOINT_H_
#define PDSERVE_COMMON_MODEL_QUANTIZED_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/safetensors.h"

namespace pdserve {

// How a checkpoint's weights are quantized, validated.
struct CheckpointQuant {
  std::string method;    // "gptq" | "awq"
  int bits = 4;          // gptq: 4 or 8; awq: 4
  int group_size = 128;  // -1: one group per row
  bool desc_act = false;
  bool sym = true;
  bool zeros_minus_one = true;  // GPTQ v1: qzeros hold zero - 1
  // Canonical text for the model fingerprint, e.g. "gptq-4b-g128-sym".
  std::string ToString() const;
};

// nullopt when config.json has no quantization_config; INVALID_ARGUMENT or
// UNIMPLEMENTED (naming `source` and the key) for a method, bit width or
// version that is not supported (e.g. 3 bits, AWQ "gemv").
absl::StatusOr<std::optional<CheckpointQuant>> ParseCheckpointQuant(
    absl::string_view config_json, absl::string_view source);

// The checkpoint in `dir`: config.json's quantization_config (its text is
// `config_json`) if present, else `dir`/quantize_config.json (AutoGPTQ;
// quant_method defaults to gptq), else `dir`/quant_config.json (AutoAWQ:
// w_bit, q_group_size, version "GEMM"; defaults to awq). nullopt when none
// says the weights are quantized; errors name the file and key.
absl::StatusOr<std::optional<CheckpointQuant>> ReadCheckpointQuant(
    const std::string& dir, absl::string_view config_json);

// One linear layer, unpacked. rows = out features, cols = in features.
struct QuantizedWeight {
  int bits = 4;
  int64_t rows = 0, cols = 0;
  int64_t groups = 0;
  std::vector<uint8_t> codes;  // [rows][cols], in [0, 2^bits)
  std::vector<float> scales;   // [groups][rows]
  std::vector<int32_t> zeros;  // [groups][rows]
  std::vector<int32_t> g_idx;  // [cols], in [0, groups)
  double Dequantized(int64_t n, int64_t k) const {
    const int64_t g = g_idx[k];
    return static_cast<double>(scales[g * rows + n]) *
           (static_cast<int>(codes[n * cols + k]) - zeros[g * rows + n]);
  }
};

// The layer whose HF weight is `prefix`.weight ([rows][cols]): reads
// `prefix`.qweight, .qzeros, .scales (and .g_idx). Errors name the tensor:
// NOT_FOUND when missing (act-order without g_idx included),
// INVALID_ARGUMENT for a wrong shape, dtype or value.
absl::StatusOr<QuantizedWeight> LoadQuantizedLinear(const Checkpoint& ckpt,
                                                    const CheckpointQuant& q,
                                                    const std::string& prefix,
                                                    int64_t rows, int64_t cols);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_QUANTIZED_CHECKPOINT_H_
