// Model architecture (config.json) and generation defaults
// (generation_config.json), parsed with Hugging Face transformers' semantics
// for the Llama family (llama, mistral, qwen2). Plain values;
// thread-compatible.
#ifndef PDSERVE_COMMON_MODEL_CONFIG_H_
#define PDSERVE_COMMON_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve {

enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  // llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string model_type;  // llama | mistral | qwen2
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool qkv_bias = false;  // llama attention_bias, qwen2 (always)
  bool o_bias = false;    // llama attention_bias
  bool mlp_bias = false;  // llama mlp_bias
  bool tie_word_embeddings = false;
  // Per layer: the sliding window (key j visible to query i iff i - j <
  // window), or 0 for full attention. Size num_layers.
  std::vector<int> layer_sliding_window;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // from config.json

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Canonical, deterministic text of every field (used by the fingerprint).
  std::string CanonicalString() const;
};

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;  // every id ends generation
  std::optional<int32_t> bos_token_id;
};

// Parses config.json text. `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source);
// Parses generation_config.json text; eos falls back to `model`'s ids when
// the key is absent.
absl::StatusOr<GenerationConfig> ParseGenerationConfig(
    absl::string_view json_text, absl::string_view source,
    const ModelConfig& model);

// Per-dimension-pair RoPE inverse frequencies (head_dim / 2 values) computed in
// float32 as transformers does, scaling applied.
std::vector<float> RopeInvFreq(const ModelConfig& config);

// Hugging Face tensors stacked along the output dimension, as the backends
// fuse them (q|k|v, gate|up): names[i] has shape [rows[i]][cols] (cols = 0
// for biases, which are [rows[i]]).
struct TensorGroup {
  std::vector<std::string> names;
  std::vector<int64_t> rows;
  int64_t cols = 0;
};

// The tensors of one decoder layer under this config: the single place that
// knows the checkpoint's names, shapes and which biases exist.
struct LayerTensors {
  std::string attn_norm, mlp_norm;  // [hidden]
  TensorGroup qkv, o, gate_up, down;
  std::optional<TensorGroup> qkv_bias, o_bias, gate_up_bias, down_bias;
};
LayerTensors DescribeLayerTensors(const ModelConfig& config, int layer);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_CONFIG_H_
