// Where a model's weights come from: a Hugging Face checkpoint directory
// (config.json, generation_config.json, safetensors, memory-mapped) or a
// synthetic model with deterministic random weights at a real model's shape.
// The backend pulls each tensor once (in HF layout [out][in]) to convert/pack
// it, then drops the source, which releases the mappings. Not thread-safe.
#ifndef PDSERVE_COMMON_MODEL_MODEL_SOURCE_H_
#define PDSERVE_COMMON_MODEL_MODEL_SOURCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "common/model/dtype.h"
#include "common/model/quantized_checkpoint.h"

namespace pdserve {

// A tensor as stored (F32, F16 or BF16), row-major in HF layout.
struct WeightView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // may be unaligned
  int64_t num_elements() const;
};

class ModelSource {
 public:
  virtual ~ModelSource() = default;
  const ModelConfig& config() const { return config_; }
  const GenerationConfig& generation_config() const { return gen_config_; }
  // Hex XXH3-128 of the canonical config, every tensor's name/shape/dtype and
  // a sample of the weight bytes (synthetic: of the name and seed).
  const std::string& fingerprint() const { return fingerprint_; }
  // Tensor `name`, checked against `shape` (error naming file and tensor).
  // The view is valid until the next Get call or the source's destruction.
  virtual absl::StatusOr<WeightView> Get(const std::string& name,
                                         const std::vector<int64_t>& shape) = 0;
  virtual bool Has(const std::string& name) const = 0;

  // GPTQ/AWQ: the checkpoint's quantization_config (else nullopt), whether
  // linear `weight_name` ("....q_proj.weight") is stored quantized, and its
  // codes, scales and zero points (errors name the tensor).
  const std::optional<CheckpointQuant>& checkpoint_quant() const {
    return checkpoint_quant_;
  }
  virtual bool IsQuantized(const std::string& weight_name) const {
    return false;
  }
  virtual absl::StatusOr<QuantizedWeight> GetQuantized(
      const std::string& weight_name, int64_t rows, int64_t cols) {
    return absl::NotFoundError(
        absl::StrCat("'", weight_name, "' is not stored quantized"));
  }

 protected:
  std::optional<CheckpointQuant> checkpoint_quant_;
  ModelConfig config_;
  GenerationConfig gen_config_;
  std::string fingerprint_;
};

// `model` is a directory or "synthetic:NAME" (llama-110m, llama-1b,
// llama3-8b, or test shapes: tiny, tiny-gqa). Synthetic weights are generated
// directly in `synthetic_dtype` from `seed`.
absl::StatusOr<std::unique_ptr<ModelSource>> OpenModelSource(
    const std::string& model, DType synthetic_dtype, uint64_t seed);

// Synthetic configs by name (NOT_FOUND for unknown names).
absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& name);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_MODEL_SOURCE_H_
