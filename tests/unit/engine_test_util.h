// Shared helpers for the engine tests (engine_test.cc,
// engine_kv_transfer_test.cc; the references also scheduler_test.cc,
// cuda_runner_test.cc and accuracy_test.cc): stories260K's reference
// generations, engines built the tests' way, bitwise comparison of logits.
// Test-only; no state.
#ifndef PDSERVE_TESTS_UNIT_ENGINE_TEST_UTIL_H_
#define PDSERVE_TESTS_UNIT_ENGINE_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve::testing_util {

// One line of models/stories260K/reference_greedy.jsonl.
struct Reference {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  int max_new_tokens;
  std::string stop_reason;
  std::vector<std::pair<int32_t, double>> top5;
};

inline std::vector<Reference> LoadReferences() {
  std::ifstream in("models/stories260K/reference_greedy.jsonl");
  std::vector<Reference> refs;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    Reference r;
    r.prompt_ids = j["prompt_ids"].get<std::vector<int32_t>>();
    r.output_ids = j["output_ids"].get<std::vector<int32_t>>();
    r.max_new_tokens = j["max_new_tokens"].get<int>();
    r.stop_reason = j["stop_reason"].get<std::string>();
    for (const auto& p : j["first_logits_top5"]) {
      r.top5.emplace_back(p[0].get<int32_t>(), p[1].get<double>());
    }
    refs.push_back(r);
  }
  return refs;
}

inline std::unique_ptr<Engine> MakeEngine(
    const std::string& model, DType dtype, int threads = 2, int block_size = 16,
    const std::string& quantization = "none") {
  EngineOptions o;
  o.model = model;
  o.weight_dtype = dtype;
  o.quantization = *ParseQuantization(quantization);
  o.kv_cache_bytes = 64 << 20;
  o.num_threads = threads;
  o.block_size = block_size;
  o.max_batch_tokens = 1024;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

inline bool SameBits(const float* a, const float* b, int n) {
  return std::memcmp(a, b, sizeof(float) * n) == 0;
}

inline std::vector<std::vector<int32_t>> ReferencePrompts() {
  std::vector<std::vector<int32_t>> p;
  for (const auto& r : LoadReferences()) p.push_back(r.prompt_ids);
  return p;
}

}  // namespace pdserve::testing_util

#endif  // PDSERVE_TESTS_UNIT_ENGINE_TEST_UTIL_H_
