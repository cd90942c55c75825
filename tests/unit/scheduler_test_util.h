// Helpers of the GenerationScheduler tests: a stories260K engine with a
// chosen KV pool, greedy/seeded requests and random prompts. Stateless.
#ifndef PDSERVE_TESTS_UNIT_SCHEDULER_TEST_UTIL_H_
#define PDSERVE_TESTS_UNIT_SCHEDULER_TEST_UTIL_H_

#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/scheduler.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_util.h"

namespace pdserve::scheduler_test {

using testing_util::Reference;

struct PoolOptions {
  int64_t kv_bytes = 64 << 20;
  int block_size = 16;
  bool prefix_cache = true;
};

inline std::unique_ptr<Engine> MakeEngine(const PoolOptions& p) {
  EngineOptions o;
  o.model = "models/stories260K";
  o.kv_cache_bytes = p.kv_bytes;
  o.block_size = p.block_size;
  o.num_threads = 2;
  o.max_batch_tokens = 512;
  o.enable_prefix_caching = p.prefix_cache;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

inline GenerationRequest Greedy(const Reference& r) {
  GenerationRequest g;
  g.prompt_ids = r.prompt_ids;
  g.sampling.temperature = 0;
  g.stop.max_tokens = r.max_new_tokens;
  return g;
}

inline GenerationRequest Seeded(std::vector<int32_t> prompt, uint64_t seed,
                                int max_tokens) {
  GenerationRequest g;
  g.prompt_ids = std::move(prompt);
  g.sampling.temperature = 0.9f;
  g.sampling.top_p = 0.9f;
  g.sampling.top_k = 40;
  g.sampling.repetition_penalty = 1.1f;  // depends on prompt + output so far
  g.sampling.seed = seed;
  g.stop.max_tokens = max_tokens;
  g.stop.ignore_eos = true;
  return g;
}

inline std::vector<int32_t> RandomTokens(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, 511);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

}  // namespace pdserve::scheduler_test

#endif  // PDSERVE_TESTS_UNIT_SCHEDULER_TEST_UTIL_H_
