#include "common/model/config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using Json = nlohmann::json;

bool Present(const Json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// Reads an optional number; INVALID_ARGUMENT when present with another type.
template <typename T>
absl::Status ReadNumber(const Json& j, const char* key, T default_value, T* out,
                        absl::string_view source) {
  if (!Present(j, key)) {
    *out = default_value;
    return absl::OkStatus();
  }
  if (!j[key].is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": '", key, "' must be a number"));
  }
  *out = j[key].get<T>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& j, const char* key, bool default_value,
                      bool* out, absl::string_view source) {
  if (!Present(j, key)) {
    *out = default_value;
    return absl::OkStatus();
  }
  if (!j[key].is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": '", key, "' must be a boolean"));
  }
  *out = j[key].get<bool>();
  return absl::OkStatus();
}

// eos_token_id: an int, a list of ints, or null/absent (empty list).
absl::StatusOr<std::vector<int32_t>> ReadIdList(const Json& j, const char* key,
                                                absl::string_view source) {
  std::vector<int32_t> ids;
  if (!Present(j, key)) return ids;
  if (j[key].is_number_integer()) {
    ids.push_back(j[key].get<int32_t>());
  } else if (j[key].is_array()) {
    for (const auto& v : j[key]) {
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": '", key, "' must hold integers"));
      }
      ids.push_back(v.get<int32_t>());
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": '", key, "' must be an integer or a list"));
  }
  return ids;
}

absl::StatusOr<ModelConfig> ParseModelConfigJson(const Json& j,
                                                 absl::string_view source) {
  ModelConfig c;
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a JSON object"));
  }
  if (!j.contains("model_type") || !j["model_type"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": missing string 'model_type'"));
  }
  c.model_type = j["model_type"].get<std::string>();
  const bool llama = c.model_type == "llama";
  const bool mistral = c.model_type == "mistral";
  const bool qwen2 = c.model_type == "qwen2";
  if (!llama && !mistral && !qwen2) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": unsupported model_type '", c.model_type,
                     "' (supported: llama, mistral, qwen2)"));
  }
  // Defaults are those of the transformers config classes.
  RETURN_IF_ERROR(ReadNumber(j, "vocab_size",
                             llama ? 32000 : (mistral ? 32000 : 151936),
                             &c.vocab_size, source));
  RETURN_IF_ERROR(ReadNumber(j, "hidden_size", qwen2 ? 4096 : 4096,
                             &c.hidden_size, source));
  RETURN_IF_ERROR(ReadNumber(j, "intermediate_size",
                             llama ? 11008 : (mistral ? 14336 : 22016),
                             &c.intermediate_size, source));
  RETURN_IF_ERROR(
      ReadNumber(j, "num_hidden_layers", 32, &c.num_layers, source));
  RETURN_IF_ERROR(
      ReadNumber(j, "num_attention_heads", 32, &c.num_heads, source));
  // A missing key takes the config class default (mistral 8, qwen2 32, llama
  // = heads); an explicit null means "= heads", as transformers does.
  if (j.contains("num_key_value_heads") && j["num_key_value_heads"].is_null()) {
    c.num_kv_heads = c.num_heads;
  } else {
    RETURN_IF_ERROR(ReadNumber(j, "num_key_value_heads",
                               mistral ? 8 : (qwen2 ? 32 : c.num_heads),
                               &c.num_kv_heads, source));
  }
  if (c.hidden_size <= 0 || c.num_heads <= 0 || c.num_layers <= 0 ||
      c.vocab_size <= 0 || c.intermediate_size <= 0 || c.num_kv_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": sizes must be positive"));
  }
  RETURN_IF_ERROR(ReadNumber(j, "head_dim", c.hidden_size / c.num_heads,
                             &c.head_dim, source));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": head_dim must be positive and even"));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": num_attention_heads (", c.num_heads,
        ") is not a multiple of num_key_value_heads (", c.num_kv_heads, ")"));
  }
  RETURN_IF_ERROR(ReadNumber(j, "max_position_embeddings",
                             llama ? 2048 : (mistral ? 4096 * 32 : 32768),
                             &c.max_position_embeddings, source));
  RETURN_IF_ERROR(ReadNumber(j, "rms_norm_eps", 1e-6, &c.rms_norm_eps, source));
  RETURN_IF_ERROR(ReadNumber(j, "rope_theta", 10000.0, &c.rope_theta, source));
  if (Present(j, "hidden_act")) {
    if (!j["hidden_act"].is_string() ||
        j["hidden_act"].get<std::string>() != "silu") {
      return absl::UnimplementedError(
          absl::StrCat(source, ": unsupported hidden_act ",
                       j["hidden_act"].dump(), " (only silu)"));
    }
  }
  if (Present(j, "partial_rotary_factor") &&
      j["partial_rotary_factor"].is_number() &&
      j["partial_rotary_factor"].get<double>() != 1.0) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": partial_rotary_factor != 1 is not supported"));
  }
  RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", false,
                           &c.tie_word_embeddings, source));
  if (llama) {
    bool attention_bias = false;
    RETURN_IF_ERROR(
        ReadBool(j, "attention_bias", false, &attention_bias, source));
    c.qkv_bias = c.o_bias = attention_bias;
    RETURN_IF_ERROR(ReadBool(j, "mlp_bias", false, &c.mlp_bias, source));
  } else if (qwen2) {
    c.qkv_bias = true;
  }
  // rope_scaling.
  if (Present(j, "rope_scaling")) {
    const Json& rs = j["rope_scaling"];
    if (!rs.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": 'rope_scaling' must be an object or null"));
    }
    std::string type;
    if (rs.contains("rope_type") && rs["rope_type"].is_string()) {
      type = rs["rope_type"].get<std::string>();
    } else if (rs.contains("type") && rs["type"].is_string()) {
      type = rs["type"].get<std::string>();
    }
    auto need = [&](const char* key, double* out) -> absl::Status {
      if (!Present(rs, key) || !rs[key].is_number()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": rope_scaling of type '", type,
                         "' needs number '", key, "'"));
      }
      *out = rs[key].get<double>();
      return absl::OkStatus();
    };
    if (type == "default") {
      // No scaling.
    } else if (type == "linear") {
      c.rope_scaling.type = RopeScalingType::kLinear;
      RETURN_IF_ERROR(need("factor", &c.rope_scaling.factor));
    } else if (type == "llama3") {
      c.rope_scaling.type = RopeScalingType::kLlama3;
      double orig = 0;
      RETURN_IF_ERROR(need("factor", &c.rope_scaling.factor));
      RETURN_IF_ERROR(need("low_freq_factor", &c.rope_scaling.low_freq_factor));
      RETURN_IF_ERROR(
          need("high_freq_factor", &c.rope_scaling.high_freq_factor));
      RETURN_IF_ERROR(need("original_max_position_embeddings", &orig));
      c.rope_scaling.original_max_position_embeddings =
          static_cast<int64_t>(orig);
    } else {
      return absl::UnimplementedError(
          absl::StrCat(source, ": unsupported rope_scaling type '", type,
                       "' (supported: linear, llama3)"));
    }
  }
  // Sliding windows.
  c.layer_sliding_window.assign(c.num_layers, 0);
  if (mistral) {
    int window = 4096;  // a missing key means 4096, null means none
    if (j.contains("sliding_window")) {
      if (j["sliding_window"].is_null()) {
        window = 0;
      } else if (j["sliding_window"].is_number_integer()) {
        window = j["sliding_window"].get<int>();
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": 'sliding_window' must be an integer or null"));
      }
    }
    c.layer_sliding_window.assign(c.num_layers, window);
  } else if (qwen2) {
    bool use_sliding = false;
    RETURN_IF_ERROR(
        ReadBool(j, "use_sliding_window", false, &use_sliding, source));
    int window = 4096;
    RETURN_IF_ERROR(ReadNumber(j, "sliding_window", 4096, &window, source));
    int max_window_layers = 28;
    RETURN_IF_ERROR(
        ReadNumber(j, "max_window_layers", 28, &max_window_layers, source));
    if (use_sliding && Present(j, "sliding_window")) {
      if (Present(j, "layer_types") && j["layer_types"].is_array() &&
          static_cast<int>(j["layer_types"].size()) == c.num_layers) {
        for (int i = 0; i < c.num_layers; ++i) {
          if (j["layer_types"][i] == "sliding_attention") {
            c.layer_sliding_window[i] = window;
          }
        }
      } else {
        for (int i = max_window_layers; i < c.num_layers; ++i) {
          c.layer_sliding_window[i] = window;
        }
      }
    }
  }
  for (int w : c.layer_sliding_window) {
    if (w < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": negative sliding_window"));
    }
  }
  if (Present(j, "bos_token_id") && j["bos_token_id"].is_number_integer()) {
    c.bos_token_id = j["bos_token_id"].get<int32_t>();
  }
  auto eos = ReadIdList(j, "eos_token_id", source);
  if (!eos.ok()) return eos.status();
  c.eos_token_ids = *eos;
  return c;
}

}  // namespace

std::string ModelConfig::CanonicalString() const {
  return absl::StrCat(
      "model_type=", model_type, ";hidden=", hidden_size,
      ";inter=", intermediate_size, ";layers=", num_layers,
      ";heads=", num_heads, ";kv_heads=", num_kv_heads, ";head_dim=", head_dim,
      ";vocab=", vocab_size, ";max_pos=", max_position_embeddings,
      ";eps=", absl::StrFormat("%.17g", rms_norm_eps),
      ";theta=", absl::StrFormat("%.17g", rope_theta),
      ";rope=", static_cast<int>(rope_scaling.type), ",",
      absl::StrFormat("%.17g,%.17g,%.17g,", rope_scaling.factor,
                      rope_scaling.low_freq_factor,
                      rope_scaling.high_freq_factor),
      rope_scaling.original_max_position_embeddings, ";bias=", qkv_bias, o_bias,
      mlp_bias, ";tied=", tie_word_embeddings,
      ";windows=", absl::StrJoin(layer_sliding_window, ","));
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source) {
  Json j;
  try {
    j = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  try {
    return ParseModelConfigJson(j, source);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": bad value: ", e.what()));
  }
}

absl::StatusOr<GenerationConfig> ParseGenerationConfig(
    absl::string_view json_text, absl::string_view source,
    const ModelConfig& model) {
  GenerationConfig g;
  g.eos_token_ids = model.eos_token_ids;
  g.bos_token_id = model.bos_token_id;
  if (json_text.empty()) return g;
  Json j;
  try {
    j = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a JSON object"));
  }
  if (Present(j, "eos_token_id")) {
    auto eos = ReadIdList(j, "eos_token_id", source);
    if (!eos.ok()) return eos.status();
    g.eos_token_ids = *eos;
  }
  if (Present(j, "bos_token_id") && j["bos_token_id"].is_number_integer()) {
    g.bos_token_id = j["bos_token_id"].get<int32_t>();
  }
  return g;
}

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int dim = c.head_dim;
  const float base = static_cast<float>(c.rope_theta);
  std::vector<float> inv(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0f / std::pow(base, exponent);
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScalingType::kLinear) {
    for (float& f : inv) f = f / static_cast<float>(rs.factor);
  } else if (rs.type == RopeScalingType::kLlama3) {
    const float factor = static_cast<float>(rs.factor);
    const float low = static_cast<float>(rs.low_freq_factor);
    const float high = static_cast<float>(rs.high_freq_factor);
    const float old_len =
        static_cast<float>(rs.original_max_position_embeddings);
    const float low_freq_wavelen = old_len / low;
    const float high_freq_wavelen = old_len / high;
    for (float& f : inv) {
      const float wavelen = static_cast<float>(2 * M_PI) / f;
      float llama = wavelen > low_freq_wavelen ? f / factor : f;
      const float smooth = (old_len / wavelen - low) / (high - low);
      const float smoothed = (1 - smooth) * llama / factor + smooth * llama;
      const bool medium =
          !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = medium ? smoothed : llama;
    }
  }
  return inv;
}

LayerTensors DescribeLayerTensors(const ModelConfig& c, int layer) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t Q = c.q_dim(), KV = c.kv_dim();
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  const std::string a = p + "self_attn.", m = p + "mlp.";
  LayerTensors t;
  t.attn_norm = p + "input_layernorm.weight";
  t.mlp_norm = p + "post_attention_layernorm.weight";
  t.qkv = {{a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
           {Q, KV, KV},
           H};
  t.o = {{a + "o_proj.weight"}, {H}, Q};
  t.gate_up = {{m + "gate_proj.weight", m + "up_proj.weight"}, {I, I}, H};
  t.down = {{m + "down_proj.weight"}, {H}, I};
  if (c.qkv_bias) {
    t.qkv_bias = TensorGroup{
        {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}, {Q, KV, KV}};
  }
  if (c.o_bias) t.o_bias = TensorGroup{{a + "o_proj.bias"}, {H}};
  if (c.mlp_bias) {
    t.gate_up_bias =
        TensorGroup{{m + "gate_proj.bias", m + "up_proj.bias"}, {I, I}};
    t.down_bias = TensorGroup{{m + "down_proj.bias"}, {H}};
  }
  return t;
}

}  // namespace pdserve
