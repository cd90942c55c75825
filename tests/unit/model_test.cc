// Model loading: small checkpoints of every supported kind written by the test
// (llama with biases, mistral sliding window, qwen2, explicit head_dim, MQA,
// rope scaling linear/llama3, tied with/without lm_head, F16/BF16, sharded)
// checked against a naive double-precision forward pass written here from
// transformers' definitions; config parsing; every loading error.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct Spec {
  std::string type = "llama";
  int hidden = 32, inter = 40, layers = 2, heads = 4, kv_heads = 2;
  int head_dim = 0;  // 0: not in config.json (hidden / heads)
  int vocab = 50;
  double theta = 10000.0, eps = 1e-5;
  Json rope_scaling;                              // null: none
  bool attention_bias = false, mlp_bias = false;  // llama keys
  bool tied = false, store_lm_head = true;
  Json extra = Json::object();  // more config.json keys
  std::string dtype = "F32";
  bool sharded = false;
  std::vector<int> windows;  // expected per-layer windows (0 = full)
  int hd() const { return head_dim > 0 ? head_dim : hidden / heads; }
};

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<double> values;  // as stored (after dtype rounding)
};
using Weights = std::map<std::string, Tensor>;

double RoundTo(const std::string& dtype, double v) {
  const float f = static_cast<float>(v);
  if (dtype == "BF16") return RoundToBf16(f);
  if (dtype == "F16") {
    // Round through _Float16.
    return static_cast<double>(static_cast<float>(static_cast<_Float16>(f)));
  }
  return f;
}

std::string Encode(const std::string& dtype, const std::vector<double>& v) {
  std::string out;
  for (double d : v) {
    const float f = static_cast<float>(d);
    if (dtype == "F32") {
      out.append(reinterpret_cast<const char*>(&f), 4);
    } else if (dtype == "BF16") {
      const uint16_t b = F32ToBf16(f);
      out.append(reinterpret_cast<const char*>(&b), 2);
    } else {
      const _Float16 h = static_cast<_Float16>(f);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

Weights MakeWeights(const Spec& s, uint32_t seed) {
  std::mt19937 rng(seed);
  Weights w;
  auto add = [&](const std::string& name, std::vector<int64_t> shape,
                 double scale, double offset = 0) {
    Tensor t;
    t.shape = shape;
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = 0; i < n; ++i) {
      t.values.push_back(RoundTo(s.dtype, offset + scale * u(rng)));
    }
    w[name] = t;
  };
  const int H = s.hidden, I = s.inter, D = s.hd();
  const int Q = s.heads * D, KV = s.kv_heads * D;
  const bool qwen = s.type == "qwen2";
  add("model.embed_tokens.weight", {s.vocab, H}, 1.0);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, 0.2, 1.0);
    add(p + "post_attention_layernorm.weight", {H}, 0.2, 1.0);
    add(p + "self_attn.q_proj.weight", {Q, H}, 1.5 / std::sqrt(H));
    add(p + "self_attn.k_proj.weight", {KV, H}, 1.5 / std::sqrt(H));
    add(p + "self_attn.v_proj.weight", {KV, H}, 1.5 / std::sqrt(H));
    add(p + "self_attn.o_proj.weight", {H, Q}, 1.5 / std::sqrt(Q));
    add(p + "mlp.gate_proj.weight", {I, H}, 1.5 / std::sqrt(H));
    add(p + "mlp.up_proj.weight", {I, H}, 1.5 / std::sqrt(H));
    add(p + "mlp.down_proj.weight", {H, I}, 1.5 / std::sqrt(I));
    if (s.attention_bias || qwen) {
      add(p + "self_attn.q_proj.bias", {Q}, 0.3);
      add(p + "self_attn.k_proj.bias", {KV}, 0.3);
      add(p + "self_attn.v_proj.bias", {KV}, 0.3);
    }
    if (s.attention_bias) add(p + "self_attn.o_proj.bias", {H}, 0.3);
    if (s.mlp_bias) {
      add(p + "mlp.gate_proj.bias", {I}, 0.3);
      add(p + "mlp.up_proj.bias", {I}, 0.3);
      add(p + "mlp.down_proj.bias", {H}, 0.3);
    }
  }
  add("model.norm.weight", {H}, 0.2, 1.0);
  if (!s.tied || s.store_lm_head) add("lm_head.weight", {s.vocab, H}, 1.0);
  return w;
}

Json ConfigJson(const Spec& s) {
  Json c = {{"model_type", s.type},
            {"hidden_size", s.hidden},
            {"intermediate_size", s.inter},
            {"num_hidden_layers", s.layers},
            {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads},
            {"vocab_size", s.vocab},
            {"max_position_embeddings", 128},
            {"rms_norm_eps", s.eps},
            {"rope_theta", s.theta},
            {"rope_scaling", s.rope_scaling},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", s.tied},
            {"bos_token_id", 1},
            {"eos_token_id", 2}};
  if (s.head_dim > 0) c["head_dim"] = s.head_dim;
  if (s.type == "llama") {
    c["attention_bias"] = s.attention_bias;
    c["mlp_bias"] = s.mlp_bias;
  }
  for (auto it = s.extra.begin(); it != s.extra.end(); ++it)
    c[it.key()] = it.value();
  return c;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string WriteModel(const std::string& name, const Spec& s,
                       const Weights& w) {
  const std::string dir =
      (fs::temp_directory_path() /
       ("pdserve_model_test_" + std::to_string(getpid())) / name)
          .string();
  fs::create_directories(dir);
  WriteText(dir + "/config.json", ConfigJson(s).dump(2));
  WriteText(dir + "/generation_config.json", R"({"eos_token_id": [2, 3]})");
  std::vector<TensorToWrite> all;
  for (const auto& [n, t] : w)
    all.push_back({n, s.dtype, t.shape, Encode(s.dtype, t.values)});
  if (!s.sharded) {
    EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", all).ok());
  } else {
    std::vector<TensorToWrite> a(all.begin(), all.begin() + all.size() / 2);
    std::vector<TensorToWrite> b(all.begin() + all.size() / 2, all.end());
    EXPECT_TRUE(
        WriteSafetensors(dir + "/model-00001-of-00002.safetensors", a).ok());
    EXPECT_TRUE(
        WriteSafetensors(dir + "/model-00002-of-00002.safetensors", b).ok());
    Json index = {{"metadata", Json::object()}, {"weight_map", Json::object()}};
    for (auto& t : a)
      index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
    for (auto& t : b)
      index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
    WriteText(dir + "/model.safetensors.index.json", index.dump());
  }
  return dir;
}

// ---- The independent reference: transformers' Llama/Mistral/Qwen2 forward
// pass, naive, in double precision. Returns the logits at every position.
std::vector<std::vector<double>> ReferenceForward(
    const Spec& s, const Weights& w, const std::vector<int32_t>& ids) {
  const int H = s.hidden, I = s.inter, D = s.hd(), n = ids.size();
  const int Q = s.heads * D;
  auto W = [&](const std::string& name) -> const Tensor* {
    auto it = w.find(name);
    return it == w.end() ? nullptr : &it->second;
  };
  auto linear = [&](const std::vector<double>& x, const std::string& name) {
    const Tensor& t = *W(name + ".weight");
    const Tensor* b = W(name + ".bias");
    std::vector<double> y(t.shape[0]);
    for (int64_t o = 0; o < t.shape[0]; ++o) {
      double acc = b ? b->values[o] : 0.0;
      for (int64_t i = 0; i < t.shape[1]; ++i)
        acc += t.values[o * t.shape[1] + i] * x[i];
      y[o] = acc;
    }
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, const std::string& name) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / x.size() + s.eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = W(name)->values[i] * x[i] * r;
    return y;
  };
  // inv_freq (transformers' _compute_default / linear / llama3 parameters).
  std::vector<double> inv(D / 2);
  for (int i = 0; i < D / 2; ++i) inv[i] = 1.0 / std::pow(s.theta, 2.0 * i / D);
  if (!s.rope_scaling.is_null()) {
    const std::string type =
        s.rope_scaling.value("rope_type", s.rope_scaling.value("type", ""));
    const double factor = s.rope_scaling["factor"];
    if (type == "linear") {
      for (double& f : inv) f /= factor;
    } else if (type == "llama3") {
      const double low = s.rope_scaling["low_freq_factor"];
      const double high = s.rope_scaling["high_freq_factor"];
      const double old = s.rope_scaling["original_max_position_embeddings"];
      for (double& f : inv) {
        const double wavelen = 2 * M_PI / f;
        if (wavelen < old / high) continue;  // high frequency: unchanged
        if (wavelen > old / low) {
          f /= factor;
        } else {
          const double smooth = (old / wavelen - low) / (high - low);
          f = (1 - smooth) * f / factor + smooth * f;
        }
      }
    }
  }
  auto rope = [&](std::vector<double>& v, int heads, int pos) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < D / 2; ++i) {
        const double c = std::cos(pos * inv[i]), sn = std::sin(pos * inv[i]);
        double& a = v[h * D + i];
        double& b = v[h * D + i + D / 2];
        const double x1 = a, x2 = b;
        a = x1 * c - x2 * sn;
        b = x2 * c + x1 * sn;
      }
    }
  };
  std::vector<std::vector<double>> x(n);
  for (int t = 0; t < n; ++t) {
    const Tensor& e = *W("model.embed_tokens.weight");
    x[t].assign(e.values.begin() + ids[t] * H,
                e.values.begin() + (ids[t] + 1) * H);
  }
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      auto h = rmsnorm(x[t], p + "input_layernorm.weight");
      q[t] = linear(h, p + "self_attn.q_proj");
      k[t] = linear(h, p + "self_attn.k_proj");
      v[t] = linear(h, p + "self_attn.v_proj");
      rope(q[t], s.heads, t);
      rope(k[t], s.kv_heads, t);
    }
    const int window = s.windows.empty() ? 0 : s.windows[l];
    for (int t = 0; t < n; ++t) {
      std::vector<double> attn(Q, 0.0);
      for (int h = 0; h < s.heads; ++h) {
        const int g = h / (s.heads / s.kv_heads);
        std::vector<double> sc;
        std::vector<int> js;
        for (int j = 0; j <= t; ++j) {
          if (window > 0 && t - j >= window) continue;
          double d = 0;
          for (int i = 0; i < D; ++i) d += q[t][h * D + i] * k[j][g * D + i];
          sc.push_back(d / std::sqrt(static_cast<double>(D)));
          js.push_back(j);
        }
        double m = -1e300, z = 0;
        for (double v2 : sc) m = std::max(m, v2);
        for (double& v2 : sc) z += (v2 = std::exp(v2 - m));
        for (size_t a = 0; a < js.size(); ++a) {
          for (int i = 0; i < D; ++i)
            attn[h * D + i] += sc[a] / z * v[js[a]][g * D + i];
        }
      }
      auto o = linear(attn, p + "self_attn.o_proj");
      for (int i = 0; i < H; ++i) x[t][i] += o[i];
      auto h2 = rmsnorm(x[t], p + "post_attention_layernorm.weight");
      auto gate = linear(h2, p + "mlp.gate_proj");
      auto up = linear(h2, p + "mlp.up_proj");
      std::vector<double> act(I);
      for (int i = 0; i < I; ++i)
        act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      auto down = linear(act, p + "mlp.down_proj");
      for (int i = 0; i < H; ++i) x[t][i] += down[i];
    }
  }
  std::vector<std::vector<double>> logits(n);
  const std::string head = s.tied ? "model.embed_tokens" : "lm_head";
  for (int t = 0; t < n; ++t) {
    auto h = rmsnorm(x[t], "model.norm.weight");
    const Tensor& e = *W(head + ".weight");
    logits[t].resize(s.vocab);
    for (int o = 0; o < s.vocab; ++o) {
      double acc = 0;
      for (int i = 0; i < H; ++i) acc += e.values[o * H + i] * h[i];
      logits[t][o] = acc;
    }
  }
  return logits;
}

// Loads the checkpoint, prefills 9 tokens then decodes 11 more one by one
// (20 > every sliding window used), comparing each step's logits with the
// reference within 1e-4, and checks the parsed windows.
void CheckAgainstReference(const std::string& name, const Spec& s) {
  const Weights w = MakeWeights(s, std::hash<std::string>()(name) & 0xffff);
  const std::string dir = WriteModel(name, s, w);
  EngineOptions o;
  o.model = dir;
  o.kv_cache_bytes = 8 << 20;
  o.num_threads = 2;
  o.block_size = 4;
  o.max_batch_tokens = 64;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << name << ": " << engine.status();
  Engine& e = **engine;
  if (!s.windows.empty()) {
    EXPECT_EQ(e.config().layer_sliding_window, s.windows) << name;
  }
  EXPECT_EQ(e.generation_config().eos_token_ids, (std::vector<int32_t>{2, 3}));
  std::mt19937 rng(1);
  std::vector<int32_t> ids(20);
  for (auto& t : ids) t = rng() % s.vocab;
  const auto ref = ReferenceForward(s, w, ids);
  SeqId seq = *e.CreateSequence();
  std::vector<float> logits;
  double worst = 0;
  for (int end = 9; end <= 20; ++end) {
    const int begin = end == 9 ? 0 : end - 1;
    Engine::ForwardItem item{
        seq, absl::MakeConstSpan(ids.data() + begin, end - begin), true};
    ASSERT_TRUE(e.Forward({&item, 1}, &logits).ok());
    for (int v = 0; v < s.vocab; ++v) {
      worst = std::max(worst, std::fabs(logits[v] - ref[end - 1][v]));
    }
  }
  EXPECT_LT(worst, 1e-4) << name;
}

TEST(Checkpoints, LlamaWithAttentionAndMlpBiasAndExplicitHeadDim) {
  Spec s;
  s.attention_bias = true;
  s.mlp_bias = true;
  s.head_dim = 12;  // != hidden / heads = 8
  CheckAgainstReference("llama_bias", s);
}

TEST(Checkpoints, MistralSlidingWindowSmallerThanSequence) {
  Spec s;
  s.type = "mistral";
  s.extra = {{"sliding_window", 5}};
  s.windows = {5, 5};
  CheckAgainstReference("mistral_window", s);
}

TEST(Checkpoints, Qwen2BiasesAndLayerSlidingWindow) {
  Spec s;
  s.type = "qwen2";
  CheckAgainstReference("qwen2", s);
  s.extra = {{"use_sliding_window", true},
             {"sliding_window", 4},
             {"max_window_layers", 1}};
  s.windows = {0, 4};
  CheckAgainstReference("qwen2_window", s);
}

TEST(Checkpoints, MqaWithLinearRopeScaling) {
  Spec s;
  s.kv_heads = 1;
  s.rope_scaling = {{"type", "linear"}, {"factor", 2.0}};
  CheckAgainstReference("mqa_linear", s);
}

TEST(Checkpoints, Llama3RopeScaling) {
  Spec s;
  s.heads = 2;
  s.kv_heads = 1;  // head_dim 16: frequencies fall in all three llama3 bands
  s.rope_scaling = {{"rope_type", "llama3"},
                    {"factor", 8.0},
                    {"low_freq_factor", 1.0},
                    {"high_freq_factor", 4.0},
                    {"original_max_position_embeddings", 16}};
  CheckAgainstReference("llama3_rope", s);
}

TEST(Checkpoints, TiedWithAndWithoutStoredLmHead) {
  Spec s;
  s.tied = true;
  s.store_lm_head = false;
  CheckAgainstReference("tied_no_head", s);
  s.store_lm_head = true;  // a stored (different) lm_head is ignored when tied
  CheckAgainstReference("tied_with_head", s);
}

TEST(Checkpoints, Bf16AndF16TensorsAndShardedIndex) {
  Spec s;
  s.dtype = "BF16";
  CheckAgainstReference("bf16", s);
  s.dtype = "F16";
  s.sharded = true;
  CheckAgainstReference("f16_sharded", s);
}

TEST(Config, MistralWindowDefaultsAndHfDefaults) {
  const std::string base = R"("hidden_size": 16, "intermediate_size": 8,
      "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10)";
  const std::string kv = R"("num_key_value_heads": 2, )";
  auto missing =
      ParseModelConfig(R"({"model_type": "mistral", )" + kv + base + "}", "c");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->layer_sliding_window, (std::vector<int>{4096, 4096}));
  auto null_window = ParseModelConfig(
      R"({"model_type": "mistral", "sliding_window": null, )" + kv + base + "}",
      "c");
  ASSERT_TRUE(null_window.ok());
  EXPECT_EQ(null_window->layer_sliding_window, (std::vector<int>{0, 0}));
  auto llama =
      ParseModelConfig(R"({"model_type": "llama", )" + base + "}", "c");
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->num_kv_heads, 2);  // defaults to the attention heads
  EXPECT_EQ(llama->head_dim, 8);
  EXPECT_FALSE(llama->tie_word_embeddings);
  auto gen = ParseGenerationConfig(R"({"eos_token_id": 7})", "g", *llama);
  ASSERT_TRUE(gen.ok());
  EXPECT_EQ(gen->eos_token_ids, (std::vector<int32_t>{7}));
  auto bad_rope = ParseModelConfig(
      R"({"model_type": "llama", "rope_scaling": {"type": "yarn", "factor": 2}, )" +
          base + "}",
      "c");
  EXPECT_EQ(bad_rope.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(bad_rope.status().message().find("yarn"), std::string::npos);
}

// ---- Loading errors: each names the file and, where there is one, the tensor.
class LoadErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_.layers = 1;
    weights_ = MakeWeights(spec_, 3);
  }
  std::string Good(const std::string& name) {
    return WriteModel(name, spec_, weights_);
  }
  absl::Status Load(const std::string& dir) {
    EngineOptions o;
    o.model = dir;
    o.kv_cache_bytes = 1 << 20;
    o.num_threads = 1;
    return Engine::Create(o).status();
  }
  // Rewrites model.safetensors with a raw header + data.
  void WriteRaw(const std::string& dir, uint64_t header_len,
                const std::string& header, const std::string& data) {
    std::ofstream out(dir + "/model.safetensors",
                      std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&header_len), 8);
    out << header << data;
  }
  void ExpectError(const absl::Status& s, std::vector<std::string> mentions) {
    EXPECT_FALSE(s.ok());
    for (const auto& m : mentions) {
      EXPECT_NE(s.message().find(m), std::string::npos) << s << " lacks " << m;
    }
  }
  Spec spec_;
  Weights weights_;
};

TEST_F(LoadErrors, MissingConfig) {
  const std::string dir = Good("missing_config");
  fs::remove(dir + "/config.json");
  ExpectError(Load(dir), {"config.json"});
}

TEST_F(LoadErrors, UnsupportedModelType) {
  const std::string dir = Good("gpt2");
  Json c = ConfigJson(spec_);
  c["model_type"] = "gpt2";
  WriteText(dir + "/config.json", c.dump());
  const absl::Status s = Load(dir);
  ExpectError(s, {"gpt2", "config.json"});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
}

TEST_F(LoadErrors, MissingTensor) {
  weights_.erase("model.layers.0.mlp.up_proj.weight");
  ExpectError(Load(Good("missing_tensor")),
              {"model.layers.0.mlp.up_proj.weight", "model.safetensors"});
}

TEST_F(LoadErrors, MisshapedTensor) {
  weights_["model.norm.weight"].shape = {16, 2};
  ExpectError(Load(Good("misshaped")),
              {"model.norm.weight", "[16, 2]", "model.safetensors"});
}

TEST_F(LoadErrors, TruncatedHeader) {
  const std::string dir = Good("truncated");
  std::ofstream(dir + "/model.safetensors", std::ios::binary | std::ios::trunc)
      << "abc";
  ExpectError(Load(dir), {"model.safetensors", "truncated"});
}

TEST_F(LoadErrors, CorruptJsonHeader) {
  const std::string dir = Good("corrupt_json");
  WriteRaw(dir, 10, "{\"a\": [1,", "");
  ExpectError(Load(dir), {"model.safetensors", "corrupt"});
}

TEST_F(LoadErrors, HeaderLengthBeyondFile) {
  const std::string dir = Good("long_header");
  WriteRaw(dir, 1 << 20, "{}", "");
  ExpectError(Load(dir), {"model.safetensors", "header length"});
}

TEST_F(LoadErrors, DataOffsetsPastEnd) {
  const std::string dir = Good("offsets");
  const std::string header =
      R"({"model.norm.weight": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}})";
  WriteRaw(dir, header.size(), header, std::string(64, '\0'));
  ExpectError(Load(dir),
              {"model.safetensors", "model.norm.weight", "past the end"});
}

TEST_F(LoadErrors, UnsupportedDtype) {
  const std::string dir = Good("i64");
  const std::string header =
      R"({"model.norm.weight": {"dtype": "I64", "shape": [32], "data_offsets": [0, 256]}})";
  WriteRaw(dir, header.size(), header, std::string(256, '\0'));
  ExpectError(Load(dir), {"model.safetensors", "model.norm.weight", "I64"});
}

TEST_F(LoadErrors, MissingShard) {
  spec_.sharded = true;
  const std::string dir = Good("missing_shard");
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  ExpectError(Load(dir), {"model-00002-of-00002.safetensors", "index.json"});
}

}  // namespace
}  // namespace pdserve
