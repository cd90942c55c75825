// Accuracy of the compute dtypes and quantizations on stories260K (real
// weights) over the reference texts (prompt + greedy continuation of
// models/stories260K/reference_greedy.jsonl), teacher-forced position by
// position against f32: top-1 agreement, mean and max |delta logit|, and the
// mean negative log-likelihood of the reference continuations. Prints the
// table of docs/performance.md; asserts int8's top-1 agreement >= 99%.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_util.h"

namespace pdserve {
namespace {

struct Text {
  std::vector<int32_t> ids;
  size_t prompt_len = 0;
};

std::vector<Text> ReferenceTexts() {
  std::vector<Text> texts;
  for (const testing_util::Reference& r : testing_util::LoadReferences()) {
    Text t;
    t.ids = r.prompt_ids;
    t.prompt_len = t.ids.size();
    t.ids.insert(t.ids.end(), r.output_ids.begin(), r.output_ids.end());
    texts.push_back(t);
  }
  return texts;
}

// Logits after each token of `t` (teacher-forced, one token per pass).
std::vector<std::vector<float>> Logits(Engine& e, const Text& t) {
  std::vector<std::vector<float>> out;
  SeqId seq = *e.CreateSequence();
  std::vector<float> logits;
  for (size_t i = 0; i + 1 < t.ids.size(); ++i) {
    Engine::ForwardItem item{seq, absl::MakeConstSpan(&t.ids[i], 1), true};
    EXPECT_TRUE(e.Forward({&item, 1}, &logits).ok());
    out.push_back(logits);
  }
  e.FreeSequence(seq);
  return out;
}

struct Row {
  double top1 = 0, mean_delta = 0, max_delta = 0, nll = 0;
};

TEST(Accuracy, Stories260KDtypesAndQuantizations) {
  const auto texts = ReferenceTexts();
  ASSERT_EQ(texts.size(), 3u);
  struct Config {
    const char* name;
    DType dtype;
    const char* quantization;
  };
  const Config configs[] = {
      {"f32", DType::kF32, "none"},
      {"bf16", DType::kBF16, "none"},
      {"int8, per channel (bf16 compute)", DType::kBF16, "int8"},
      {"int8-g32 (bf16 compute)", DType::kBF16, "int8-g32"},
      {"int4, groups of 128 (bf16 compute)", DType::kBF16, "int4"},
      {"int4-g32 (bf16 compute)", DType::kBF16, "int4-g32"},
      {"int8, per channel, f32 numerics", DType::kF32, "int8"},
      {"int8-g32, f32 numerics", DType::kF32, "int8-g32"}};
  std::vector<std::vector<std::vector<float>>> reference;
  std::printf(
      "| weights | top-1 agreement with f32 | mean abs dlogit | max abs "
      "dlogit | mean NLL of the continuations |\n| --- | --- | --- | --- | "
      "--- |\n");
  for (const Config& c : configs) {
    EngineOptions o;
    o.model = "models/stories260K";
    o.weight_dtype = c.dtype;
    o.quantization = *ParseQuantization(c.quantization);
    o.kv_cache_bytes = 32 << 20;
    o.num_threads = 2;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status();
    Row row;
    int64_t positions = 0, agree = 0, values = 0, continuation = 0;
    for (size_t ti = 0; ti < texts.size(); ++ti) {
      const auto logits = Logits(**e, texts[ti]);
      if (reference.size() <= ti) reference.push_back(logits);
      const auto& ref = reference[ti];
      for (size_t i = 0; i < logits.size(); ++i) {
        const auto& a = logits[i];
        const auto& b = ref[i];
        const size_t top_a = std::max_element(a.begin(), a.end()) - a.begin();
        const size_t top_b = std::max_element(b.begin(), b.end()) - b.begin();
        agree += top_a == top_b;
        ++positions;
        for (size_t v = 0; v < a.size(); ++v) {
          const double d = std::fabs(static_cast<double>(a[v]) - b[v]);
          row.mean_delta += d;
          row.max_delta = std::max(row.max_delta, d);
          ++values;
        }
        if (i + 1 >= texts[ti].prompt_len) {  // predicts a continuation token
          double mx = -1e300, sum = 0;
          for (float v : a) mx = std::max<double>(mx, v);
          for (float v : a) sum += std::exp(v - mx);
          row.nll += -(a[texts[ti].ids[i + 1]] - mx - std::log(sum));
          ++continuation;
        }
      }
    }
    row.top1 = static_cast<double>(agree) / positions;
    row.mean_delta /= values;
    row.nll /= continuation;
    std::printf("| %s | %.2f%% (%lld/%lld) | %.4f | %.4f | %.4f |\n", c.name,
                100 * row.top1, static_cast<long long>(agree),
                static_cast<long long>(positions), row.mean_delta,
                row.max_delta, row.nll);
    // int8 weights with f32 numerics (the weights alone): >= 99%. On the
    // bf16 kernels (activations at 8 bits, bf16 KV) it can only be as good as
    // bf16 itself (98.8% here: stories260K has near-ties), so >= 98%.
    if (std::string(c.quantization).rfind("int8", 0) == 0) {
      EXPECT_GE(row.top1, c.dtype == DType::kF32 ? 0.99 : 0.98) << c.name;
    }
  }
}

}  // namespace
}  // namespace pdserve
