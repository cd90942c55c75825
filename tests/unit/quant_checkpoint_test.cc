// GPTQ and AWQ checkpoints as published: tests/unit/quant_checkpoint_writer.py
// (numpy, written from the format descriptions) packs small checkpoints at
// test time into a temporary directory (removed afterwards); checked here:
// (a) the unpacked codes, scales, zero points and groups equal what was
// packed, (b) the logits of --dtype=f32 equal a float64 forward pass over
// the dequantized weights within 1e-4, (c) the int kernels (--dtype=bf16)
// stay batch-invariant and close, (d) bad checkpoints are refused naming the
// tensor.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/model/quantized_checkpoint.h"
#include "common/model/safetensors.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

namespace fs = std::filesystem;

class QuantCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((fs::temp_directory_path() /
                            ("pdserve_quant_ckpt_" + std::to_string(getpid())))
                               .string());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  // Writes checkpoint KIND and returns its directory.
  static std::string Write(const std::string& kind) {
    const std::string out = *dir_ + "/" + kind;
    // Debian's python3 carries python3-numpy (scripts/install_deps.sh); a
    // python3 earlier in PATH (pyenv) may not.
    const std::string python =
        fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
    const std::string cmd =
        python + " tests/unit/quant_checkpoint_writer.py " + out + " " + kind;
    EXPECT_EQ(std::system(cmd.c_str()), 0)
        << cmd << " failed (needs python3-numpy)";
    return out;
  }
  static std::string* dir_;
};
std::string* QuantCheckpointTest::dir_ = nullptr;

std::vector<std::string> LinearPrefixes() {
  std::vector<std::string> p;
  for (int l = 0; l < 2; ++l) {
    for (const char* n : {"self_attn.q_proj", "self_attn.k_proj",
                          "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      p.push_back("model.layers." + std::to_string(l) + "." + n);
    }
  }
  return p;
}

std::vector<int32_t> Ints(const TensorInfo* t) {
  std::vector<int32_t> v(t->num_elements());
  std::memcpy(v.data(), t->data, v.size() * 4);
  return v;
}
std::vector<float> Floats(const TensorInfo* t) {
  std::vector<float> v(t->num_elements());
  std::memcpy(v.data(), t->data, v.size() * 4);
  return v;
}

// (a): what LoadQuantizedLinear unpacks is exactly what the writer packed.
void CheckUnpacked(const std::string& dir) {
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto expected = SafetensorsFile::Open(dir + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  std::ifstream in(dir + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  auto quant = ReadCheckpointQuant(dir, text);
  ASSERT_TRUE(quant.ok() && quant->has_value()) << quant.status();
  for (const std::string& prefix : LinearPrefixes()) {
    const TensorInfo* codes = (*expected)->Find(prefix + ".codes");
    ASSERT_NE(codes, nullptr) << prefix;
    const int64_t rows = codes->shape[0], cols = codes->shape[1];
    auto w = LoadQuantizedLinear(**ckpt, **quant, prefix, rows, cols);
    ASSERT_TRUE(w.ok()) << w.status();
    const std::vector<int32_t> want_codes = Ints(codes);
    for (int64_t i = 0; i < rows * cols; ++i) {
      ASSERT_EQ(w->codes[i], want_codes[i]) << dir << " " << prefix << " " << i;
    }
    EXPECT_EQ(w->scales, Floats((*expected)->Find(prefix + ".scales")))
        << prefix;
    EXPECT_EQ(w->zeros, Ints((*expected)->Find(prefix + ".zeros"))) << prefix;
    EXPECT_EQ(w->g_idx, Ints((*expected)->Find(prefix + ".g_idx"))) << prefix;
  }
}

std::unique_ptr<Engine> Open(const std::string& dir, DType dtype,
                             absl::Status* status = nullptr) {
  EngineOptions o;
  o.model = dir;
  o.weight_dtype = dtype;
  o.kv_cache_bytes = 8 << 20;
  o.num_threads = 2;
  o.block_size = 4;
  o.max_batch_tokens = 64;
  auto e = Engine::Create(o);
  if (status != nullptr) *status = e.status();
  if (!e.ok()) return nullptr;
  return std::move(*e);
}

// Logits at every position, the prompt fed `chunk` tokens per pass.
std::vector<std::vector<float>> AllLogits(Engine& e,
                                          const std::vector<int32_t>& tokens,
                                          int chunk) {
  std::vector<std::vector<float>> out;
  SeqId seq = *e.CreateSequence();
  std::vector<float> logits;
  for (size_t t = 0; t < tokens.size(); t += chunk) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - t);
    Engine::ForwardItem item{seq, absl::MakeConstSpan(tokens.data() + t, n),
                             true};
    EXPECT_TRUE(e.Forward({&item, 1}, &logits).ok());
    if (n == 1) out.push_back(logits);
  }
  e.FreeSequence(seq);
  return out;
}

// (b) and (c).
void CheckLogits(const std::string& dir) {
  auto expected = SafetensorsFile::Open(dir + "/expected.safetensors");
  ASSERT_TRUE(expected.ok());
  const std::vector<int32_t> tokens = Ints((*expected)->Find("tokens"));
  const TensorInfo* logits_t = (*expected)->Find("logits");
  const std::vector<float> want = Floats(logits_t);
  const int64_t V = logits_t->shape[1];
  auto f32 = Open(dir, DType::kF32);
  ASSERT_NE(f32, nullptr);
  const auto got = AllLogits(*f32, tokens, 1);
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int64_t v = 0; v < V; ++v) {
      worst = std::max(
          worst, std::fabs(static_cast<double>(got[t][v]) - want[t * V + v]));
    }
  }
  EXPECT_LT(worst, 1e-4) << dir;
  // The int kernels: decode step by step == the prompt in chunks of 7 (last
  // position), bit for bit; close to the f32 forward.
  auto bf16 = Open(dir, DType::kBF16);
  ASSERT_NE(bf16, nullptr);
  const auto stepwise = AllLogits(*bf16, tokens, 1);
  std::vector<float> chunked;
  {
    SeqId seq = *bf16->CreateSequence();
    for (size_t t = 0; t < tokens.size(); t += 7) {
      const size_t n = std::min<size_t>(7, tokens.size() - t);
      Engine::ForwardItem item{seq, absl::MakeConstSpan(tokens.data() + t, n),
                               true};
      ASSERT_TRUE(bf16->Forward({&item, 1}, &chunked).ok());
    }
    bf16->FreeSequence(seq);
  }
  EXPECT_EQ(std::memcmp(chunked.data(), stepwise.back().data(), V * 4), 0)
      << dir;
  double bf16_worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int64_t v = 0; v < V; ++v) {
      bf16_worst = std::max(
          bf16_worst,
          std::fabs(static_cast<double>(stepwise[t][v]) - want[t * V + v]));
    }
  }
  EXPECT_LT(bf16_worst, 0.25) << dir;
  std::printf("%s: max |logit - float64| f32 %.2e, int kernels %.3f\n",
              dir.c_str(), worst, bf16_worst);
  EXPECT_NE(f32->fingerprint(), bf16->fingerprint());
}

TEST_F(QuantCheckpointTest, Gptq4BitGroup32) {
  const std::string dir = Write("gptq4");
  CheckUnpacked(dir);
  CheckLogits(dir);
}

TEST_F(QuantCheckpointTest, Gptq8BitPerChannel) {
  const std::string dir = Write("gptq8-pc");
  CheckUnpacked(dir);
  CheckLogits(dir);
}

TEST_F(QuantCheckpointTest, Gptq4BitActOrderWithGIdx) {
  const std::string dir = Write("gptq4-actorder");
  CheckUnpacked(dir);
  CheckLogits(dir);
}

TEST_F(QuantCheckpointTest, Gptq4BitAsymmetricV2Zeros) {
  const std::string dir = Write("gptq4-asym-v2");
  CheckUnpacked(dir);
  CheckLogits(dir);
}

TEST_F(QuantCheckpointTest, Awq4BitGemm) {
  const std::string dir = Write("awq4");
  CheckUnpacked(dir);
  CheckLogits(dir);
}

// The other combinations of the formats' options: 8-bit in groups, 4-bit
// per channel, 8-bit with act-order, asymmetric v1 zeros (stored minus one),
// and groups larger than a layer's inputs (one group, as group_size=128 on
// these 64- and 96-wide layers) or than the default.
TEST_F(QuantCheckpointTest, OtherBitsGroupsAndZeroFormats) {
  for (const char* kind :
       {"gptq8", "gptq4-pc", "gptq8-actorder", "gptq4-asym", "gptq4-g128",
        "gptq8-actorder-g64", "awq4-g64", "awq4-g128"}) {
    SCOPED_TRACE(kind);
    const std::string dir = Write(kind);
    CheckUnpacked(dir);
    CheckLogits(dir);
  }
}

// AutoGPTQ's and AutoAWQ's own exports: the packing described in
// quantize_config.json / quant_config.json, config.json having none.
TEST_F(QuantCheckpointTest, QuantizerSideFilesDescribeThePacking) {
  for (const char* kind : {"gptq4-sidefile", "gptq8-actorder-sidefile",
                           "gptq4-asym-sidefile", "awq4-sidefile"}) {
    SCOPED_TRACE(kind);
    const std::string dir = Write(kind);
    std::ifstream in(dir + "/config.json");
    const std::string config((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    ASSERT_EQ(config.find("quantization_config"), std::string::npos);
    CheckUnpacked(dir);
    CheckLogits(dir);
  }
  // The side file's settings are the ones used (and fingerprinted).
  const std::string gptq = *dir_ + "/gptq4-sidefile";
  auto q = ReadCheckpointQuant(gptq, "{}");
  ASSERT_TRUE(q.ok() && q->has_value()) << q.status();
  EXPECT_EQ((*q)->ToString(), "gptq-4b-g32-sym");
  q = ReadCheckpointQuant(*dir_ + "/awq4-sidefile", "{}");
  ASSERT_TRUE(q.ok() && q->has_value()) << q.status();
  EXPECT_EQ((*q)->ToString(), "awq-4b-g32-asym");
}

// (d): refused at load, the message naming the tensor (or the config key).
TEST_F(QuantCheckpointTest, BadCheckpointsAreRefusedNamingTheTensor) {
  const std::pair<const char*, const char*> cases[] = {
      {"bad-3bit", "3 bits"},
      {"bad-shape", "model.layers.1.mlp.up_proj.qweight"},
      {"bad-no-scales", "model.layers.0.self_attn.o_proj.scales"},
      {"bad-actorder-no-gidx", "model.layers.0.self_attn.q_proj.g_idx"},
      {"bad-no-quant-config", "quantization_config"},
  };
  for (const auto& [kind, needle] : cases) {
    const std::string dir = Write(kind);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      absl::Status status;
      EXPECT_EQ(Open(dir, dtype, &status), nullptr) << kind;
      EXPECT_NE(status.message().find(needle), std::string::npos)
          << kind << ": " << status;
    }
  }
}

}  // namespace
}  // namespace pdserve
