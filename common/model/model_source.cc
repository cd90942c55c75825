#include "common/model/model_source.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/safetensors.h"
#include "common/util/status_macros.h"

namespace pdserve {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string HashHex(XXH3_state_t* state) {
  XXH128_hash_t h = XXH3_128bits_digest(state);
  return absl::StrFormat("%016x%016x", h.high64, h.low64);
}

// "a.b.weight" -> "a.b".
std::string Prefix(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - 7);
}

class CheckpointSource : public ModelSource {
 public:
  static absl::StatusOr<std::unique_ptr<ModelSource>> Open(
      const std::string& dir) {
    auto src = std::unique_ptr<CheckpointSource>(new CheckpointSource());
    const std::string config_path = dir + "/config.json";
    struct stat dir_stat;
    if (stat(dir.c_str(), &dir_stat) != 0 || !S_ISDIR(dir_stat.st_mode)) {
      return absl::NotFoundError(absl::StrCat(
          "model '", dir,
          "' is not a directory; give a Hugging Face model directory "
          "(config.json, *.safetensors, tokenizer.json), e.g. "
          "models/stories260K, or synthetic:NAME for random weights at a "
          "real shape"));
    }
    if (stat(config_path.c_str(), &dir_stat) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "model directory '", dir,
          "' has no config.json: not a Hugging Face model directory"));
    }
    ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path));
    ASSIGN_OR_RETURN(src->config_, ParseModelConfig(config_text, config_path));
    ASSIGN_OR_RETURN(src->checkpoint_quant_,
                     ReadCheckpointQuant(dir, config_text));
    const std::string gen_path = dir + "/generation_config.json";
    std::string gen_text;
    struct stat st;
    if (stat(gen_path.c_str(), &st) == 0) {
      ASSIGN_OR_RETURN(gen_text, ReadFile(gen_path));
    }
    ASSIGN_OR_RETURN(src->gen_config_,
                     ParseGenerationConfig(gen_text, gen_path, src->config_));
    ASSIGN_OR_RETURN(src->ckpt_, Checkpoint::Open(dir));
    if (!src->checkpoint_quant_.has_value()) {
      for (const TensorInfo* t : src->ckpt_->AllTensors()) {
        if (absl::EndsWith(t->name, ".qweight")) {
          return absl::InvalidArgumentError(absl::StrCat(
              t->file, ": tensor '", t->name,
              "' is a packed GPTQ/AWQ weight, but neither config.json's "
              "quantization_config nor quantize_config.json / "
              "quant_config.json says how it is packed; add the "
              "quantization_config the quantizer wrote"));
        }
      }
    }
    // Fingerprint: config + metadata + sampled bytes of every tensor.
    XXH3_state_t* state = XXH3_createState();
    XXH3_128bits_reset(state);
    std::string canon = src->config_.CanonicalString();
    if (src->checkpoint_quant_.has_value()) {
      absl::StrAppend(&canon, ";quant=", src->checkpoint_quant_->ToString());
    }
    XXH3_128bits_update(state, canon.data(), canon.size());
    for (const TensorInfo* t : src->ckpt_->AllTensors()) {
      const std::string meta = absl::StrCat(t->name, ":", DTypeName(t->dtype),
                                            ShapeString(t->shape), ";");
      XXH3_128bits_update(state, meta.data(), meta.size());
      constexpr int64_t kWindow = 64;
      for (int s = 0; s < 4; ++s) {
        const int64_t at = (t->nbytes - kWindow) * s / 3;
        const int64_t begin = std::max<int64_t>(0, at);
        const int64_t len = std::min(kWindow, t->nbytes - begin);
        if (len > 0) XXH3_128bits_update(state, t->data + begin, len);
      }
    }
    src->fingerprint_ = HashHex(state);
    XXH3_freeState(state);
    return std::unique_ptr<ModelSource>(std::move(src));
  }

  absl::StatusOr<WeightView> Get(const std::string& name,
                                 const std::vector<int64_t>& shape) override {
    ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_->Find(name));
    if (t->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          t->file, ": tensor '", name, "' has shape ", ShapeString(t->shape),
          ", expected ", ShapeString(shape), " from config.json"));
    }
    if (t->dtype == DType::kI32) {
      return absl::InvalidArgumentError(
          absl::StrCat(t->file, ": tensor '", name,
                       "' is I32, expected a floating-point tensor"));
    }
    WeightView v;
    v.dtype = t->dtype;
    v.shape = t->shape;
    v.data = t->data;
    return v;
  }
  bool Has(const std::string& name) const override { return ckpt_->Has(name); }

  bool IsQuantized(const std::string& weight_name) const override {
    return checkpoint_quant_.has_value() &&
           absl::EndsWith(weight_name, ".weight") &&
           ckpt_->Has(Prefix(weight_name) + ".qweight");
  }
  absl::StatusOr<QuantizedWeight> GetQuantized(const std::string& weight_name,
                                               int64_t rows,
                                               int64_t cols) override {
    if (!IsQuantized(weight_name)) {
      return ModelSource::GetQuantized(weight_name, rows, cols);
    }
    return LoadQuantizedLinear(*ckpt_, *checkpoint_quant_, Prefix(weight_name),
                               rows, cols);
  }

 private:
  std::unique_ptr<Checkpoint> ckpt_;
};

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class SyntheticSource : public ModelSource {
 public:
  SyntheticSource(const std::string& name, ModelConfig config, DType dtype,
                  uint64_t seed)
      : dtype_(dtype), seed_(seed) {
    config_ = std::move(config);
    gen_config_.eos_token_ids = config_.eos_token_ids;
    gen_config_.bos_token_id = config_.bos_token_id;
    XXH3_state_t* state = XXH3_createState();
    XXH3_128bits_reset(state);
    const std::string canon = absl::StrCat("synthetic:", name, ";seed=", seed,
                                           ";", config_.CanonicalString());
    XXH3_128bits_update(state, canon.data(), canon.size());
    fingerprint_ = HashHex(state);
    XXH3_freeState(state);
  }

  absl::StatusOr<WeightView> Get(const std::string& name,
                                 const std::vector<int64_t>& shape) override {
    if (!Has(name)) {
      return absl::NotFoundError(
          absl::StrCat("synthetic model: no tensor '", name, "'"));
    }
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const bool is_norm = absl::StrContains(name, "norm");
    const bool is_bias = absl::EndsWith(name, ".bias");
    // Uniform in [-a, a]: var = a^2/3 = 1/fan_in keeps activations O(1)
    // through each matmul; embeddings are O(1) too.
    const int64_t fan_in = shape.size() == 2 ? shape[1] : 1;
    const float a = std::sqrt(3.0f / static_cast<float>(fan_in));
    uint64_t rng = seed_ ^ XXH3_64bits(name.data(), name.size());
    buffer_.resize(static_cast<size_t>(n) * DTypeSize(dtype_));
    auto value = [&](int64_t) -> float {
      if (is_norm) return 1.0f;
      const uint64_t r = SplitMix64(rng);
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
      return (2.0f * u - 1.0f) * (is_bias ? 0.1f : a);
    };
    if (dtype_ == DType::kF32) {
      float* out = reinterpret_cast<float*>(buffer_.data());
      for (int64_t i = 0; i < n; ++i) out[i] = value(i);
    } else {
      uint16_t* out = reinterpret_cast<uint16_t*>(buffer_.data());
      for (int64_t i = 0; i < n; ++i) out[i] = F32ToBf16(value(i));
    }
    WeightView v;
    v.dtype = dtype_;
    v.shape = shape;
    v.data = buffer_.data();
    return v;
  }

  bool Has(const std::string& name) const override {
    if (name == "lm_head.weight") return !config_.tie_word_embeddings;
    if (absl::EndsWith(name, ".bias")) {
      if (absl::StrContains(name, "o_proj")) return config_.o_bias;
      if (absl::StrContains(name, "mlp")) return config_.mlp_bias;
      return config_.qkv_bias;
    }
    return true;
  }

 private:
  DType dtype_;
  uint64_t seed_;
  std::vector<char> buffer_;
};

ModelConfig BaseLlama() {
  ModelConfig c;
  c.model_type = "llama";
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

}  // namespace

int64_t WeightView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& name) {
  ModelConfig c = BaseLlama();
  if (name == "llama-110m") {
    c.hidden_size = 768;
    c.num_layers = 12;
    c.num_heads = 12;
    c.num_kv_heads = 12;
    c.intermediate_size = 2048;
    c.vocab_size = 32000;
    c.max_position_embeddings = 2048;
  } else if (name == "llama-1b") {
    c.hidden_size = 2048;
    c.num_layers = 16;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.intermediate_size = 8192;
    c.vocab_size = 128256;
    c.max_position_embeddings = 131072;
    c.tie_word_embeddings = true;
    c.rope_theta = 500000.0;
    c.rope_scaling = {RopeScalingType::kLlama3, 32.0, 1.0, 4.0, 8192};
  } else if (name == "llama3-8b") {
    c.hidden_size = 4096;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.intermediate_size = 14336;
    c.vocab_size = 128256;
    c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
    c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  } else if (name == "tiny") {  // test shape: odd sizes, MHA
    c.hidden_size = 48;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 4;
    c.intermediate_size = 100;
    c.vocab_size = 300;
    c.max_position_embeddings = 256;
  } else if (name == "tiny-gqa") {  // test shape: GQA, biases, head_dim 16
    c.hidden_size = 64;
    c.num_layers = 3;
    c.num_heads = 6;
    c.num_kv_heads = 2;
    c.intermediate_size = 136;
    c.vocab_size = 333;
    c.max_position_embeddings = 256;
    c.qkv_bias = true;
    c.tie_word_embeddings = true;
  } else {
    return absl::NotFoundError(absl::StrCat(
        "unknown synthetic model '", name,
        "' (known: llama-110m, llama-1b, llama3-8b, tiny, tiny-gqa)"));
  }
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_heads;
  c.layer_sliding_window.assign(c.num_layers, 0);
  return c;
}

absl::StatusOr<std::unique_ptr<ModelSource>> OpenModelSource(
    const std::string& model, DType synthetic_dtype, uint64_t seed) {
  constexpr absl::string_view kSynthetic = "synthetic:";
  if (absl::StartsWith(model, kSynthetic)) {
    const std::string name = model.substr(kSynthetic.size());
    ASSIGN_OR_RETURN(ModelConfig config, SyntheticConfig(name));
    return std::unique_ptr<ModelSource>(std::make_unique<SyntheticSource>(
        name, std::move(config), synthetic_dtype, seed));
  }
  return CheckpointSource::Open(model);
}

}  // namespace pdserve
