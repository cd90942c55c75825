// Engine tests: exactness against stories260K's reference generations, batch
// invariance (batch compositions, chunked prefill), bf16 tolerance,
// quantization, and the continuous-batching scheduler (KV export -> import
// into a second engine: engine_kv_transfer_test.cc).
#include "common/engine/engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/backend/cpu/bf16_amx.h"
#include "common/backend/cpu/packed_matrix.h"
#include "common/engine/scheduler.h"
#include "common/sampling/sampler.h"
#include "common/util/system_memory.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine_test_util.h"

namespace pdserve {
namespace {

using testing_util::LoadReferences;
using testing_util::MakeEngine;
using testing_util::Reference;
using testing_util::ReferencePrompts;
using testing_util::SameBits;

// Logits of the last token of `tokens`, run alone in one pass.
std::vector<float> LogitsAlone(Engine& e, const std::vector<int32_t>& tokens) {
  SeqId seq = *e.CreateSequence();
  std::vector<float> logits;
  Engine::ForwardItem item{seq, tokens, true};
  EXPECT_TRUE(e.Forward({&item, 1}, &logits).ok());
  e.FreeSequence(seq);
  return logits;
}

// Greedy generation driven directly through Engine::Forward.
std::vector<int32_t> GreedyDirect(Engine& e, const std::vector<int32_t>& prompt,
                                  int max_new, std::string* reason) {
  SeqId seq = *e.CreateSequence();
  std::vector<int32_t> out;
  std::vector<int32_t> feed = prompt;
  const auto& eos = e.generation_config().eos_token_ids;
  *reason = "length";
  std::vector<float> logits;
  while (static_cast<int>(out.size()) < max_new) {
    Engine::ForwardItem item{seq, feed, true};
    EXPECT_TRUE(e.Forward({&item, 1}, &logits).ok());
    int32_t best = 0;
    for (int32_t i = 1; i < e.config().vocab_size; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    if (std::find(eos.begin(), eos.end(), best) != eos.end()) {
      *reason = "stop";
      break;
    }
    out.push_back(best);
    feed = {best};
  }
  e.FreeSequence(seq);
  return out;
}

TEST(Stories260K, ReproducesReferenceGreedy) {
  auto refs = LoadReferences();
  ASSERT_EQ(refs.size(), 3u);
  auto e = MakeEngine("models/stories260K", DType::kF32);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->generation_config().eos_token_ids, (std::vector<int32_t>{2, 1}));
  for (const Reference& r : refs) {
    std::vector<float> logits = LogitsAlone(*e, r.prompt_ids);
    for (const auto& [id, value] : r.top5) {
      EXPECT_NEAR(logits[id], value, 1e-4) << "token " << id;
    }
    std::string reason;
    std::vector<int32_t> out =
        GreedyDirect(*e, r.prompt_ids, r.max_new_tokens, &reason);
    EXPECT_EQ(out, r.output_ids);
    EXPECT_EQ(reason, r.stop_reason == "bos" ? "stop" : r.stop_reason);
  }
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Checks, for one model and dtype, that each sequence's logits are
// bit-identical alone, in several batch compositions (with prefills and
// decodes mixed) and with its prompt prefilled in chunks of 1, 7 and 16.
void CheckBatchInvariance(const std::string& model, DType dtype,
                          std::vector<std::vector<int32_t>> prompts,
                          const std::string& quantization = "none") {
  auto e = MakeEngine(model, dtype, 2, 16, quantization);
  ASSERT_NE(e, nullptr);
  const int V = e->config().vocab_size;
  std::mt19937 rng(7);
  for (int n : {1, 5, 23, 40}) prompts.push_back(RandomTokens(rng, n, V));
  // A context across three 128-position attention partitions: alone, its
  // decode rows are few enough that threads split the context; in a batch
  // they are not split.
  const int long_len = std::min(300, e->config().max_position_embeddings - 2);
  prompts.push_back(RandomTokens(rng, long_len, V));
  // Reference: every prompt alone, plus one decode token.
  std::vector<std::vector<float>> alone, alone_next;
  const int32_t next_token = 3;
  for (const auto& p : prompts) {
    alone.push_back(LogitsAlone(*e, p));
    std::vector<int32_t> extended = p;
    extended.push_back(next_token);
    alone_next.push_back(LogitsAlone(*e, extended));
  }
  // Chunked prefill.
  for (int chunk : {1, 7, 16}) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      SeqId seq = *e->CreateSequence();
      std::vector<float> logits;
      for (size_t at = 0; at < prompts[i].size(); at += chunk) {
        const size_t n = std::min<size_t>(chunk, prompts[i].size() - at);
        Engine::ForwardItem item{
            seq, absl::MakeConstSpan(prompts[i].data() + at, n), true};
        ASSERT_TRUE(e->Forward({&item, 1}, &logits).ok());
      }
      EXPECT_TRUE(SameBits(logits.data(), alone[i].data(), V))
          << model << " chunk " << chunk << " prompt " << i;
      e->FreeSequence(seq);
    }
  }
  // Batch compositions: all together; reversed; odd ones decoding while even
  // ones prefill.
  std::vector<std::vector<size_t>> orders;
  std::vector<size_t> all(prompts.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  orders.push_back(all);
  orders.push_back(std::vector<size_t>(all.rbegin(), all.rend()));
  orders.push_back({0, 3});
  for (const auto& order : orders) {
    std::vector<SeqId> seqs;
    std::vector<Engine::ForwardItem> items;
    for (size_t i : order) {
      seqs.push_back(*e->CreateSequence());
      items.push_back({seqs.back(), prompts[i], true});
    }
    std::vector<float> logits;
    ASSERT_TRUE(e->Forward(items, &logits).ok());
    for (size_t j = 0; j < order.size(); ++j) {
      EXPECT_TRUE(SameBits(logits.data() + j * V, alone[order[j]].data(), V))
          << model << " batch item " << j;
    }
    // Mixed step: even items decode one token, odd ones get a fresh prompt.
    std::vector<Engine::ForwardItem> mixed;
    const int32_t tok = next_token;
    std::vector<SeqId> fresh;
    for (size_t j = 0; j < order.size(); ++j) {
      if (j % 2 == 0) {
        mixed.push_back({seqs[j], absl::MakeConstSpan(&tok, 1), true});
      } else {
        fresh.push_back(*e->CreateSequence());
        mixed.push_back({fresh.back(), prompts[order[j]], true});
      }
    }
    ASSERT_TRUE(e->Forward(mixed, &logits).ok());
    for (size_t j = 0; j < order.size(); ++j) {
      const auto& want = j % 2 == 0 ? alone_next[order[j]] : alone[order[j]];
      EXPECT_TRUE(SameBits(logits.data() + j * V, want.data(), V))
          << model << " mixed item " << j;
    }
    for (SeqId s : seqs) e->FreeSequence(s);
    for (SeqId s : fresh) e->FreeSequence(s);
  }
  EXPECT_EQ(e->free_blocks(), e->total_blocks());
}

TEST(BatchInvariance, Stories260KF32) {
  CheckBatchInvariance("models/stories260K", DType::kF32, ReferencePrompts());
}
TEST(BatchInvariance, Stories260KBf16) {
  CheckBatchInvariance("models/stories260K", DType::kBF16, ReferencePrompts());
}
TEST(BatchInvariance, SyntheticGqaF32) {
  CheckBatchInvariance("synthetic:tiny-gqa", DType::kF32, {{1, 2, 3}});
}
TEST(BatchInvariance, SyntheticGqaBf16) {
  CheckBatchInvariance("synthetic:tiny-gqa", DType::kBF16, {{1, 2, 3}});
}
// Quantized weights (int8/int4 VNNI kernels with activations quantized per
// row): the same exactness.
TEST(BatchInvariance, Stories260KInt8) {
  CheckBatchInvariance("models/stories260K", DType::kBF16, ReferencePrompts(),
                       "int8");
}
TEST(BatchInvariance, Stories260KInt4) {
  CheckBatchInvariance("models/stories260K", DType::kBF16, ReferencePrompts(),
                       "int4");
}
TEST(BatchInvariance, SyntheticGqaInt4G32AsymAndInt8G32) {
  CheckBatchInvariance("synthetic:tiny-gqa", DType::kBF16, {{1, 2, 3}},
                       "int4-g32-asym");
  CheckBatchInvariance("synthetic:tiny", DType::kBF16, {{1, 2, 3}}, "int8-g32");
}
TEST(BatchInvariance, SyntheticTinyOneThreadVsThree) {
  // The work split across threads never changes a result either.
  auto one = MakeEngine("synthetic:tiny", DType::kF32, 1);
  auto three = MakeEngine("synthetic:tiny", DType::kF32, 3);
  std::mt19937 rng(3);
  // Prompts of 37 and 250 tokens, then one decode step (at 250, three
  // threads split the decode row's context, one thread does not).
  const int V = one->config().vocab_size;
  for (int n : {37, 250}) {
    auto p = RandomTokens(rng, n, V);
    auto a = LogitsAlone(*one, p), b = LogitsAlone(*three, p);
    EXPECT_TRUE(SameBits(a.data(), b.data(), V)) << n;
    std::vector<float> decoded[2];
    Engine* engines[2] = {one.get(), three.get()};
    for (int i = 0; i < 2; ++i) {
      SeqId seq = *engines[i]->CreateSequence();
      Engine::ForwardItem prefill{seq, p, false};
      ASSERT_TRUE(engines[i]->Forward({&prefill, 1}, &decoded[i]).ok());
      const int32_t tok = 5;
      Engine::ForwardItem step{seq, absl::MakeConstSpan(&tok, 1), true};
      ASSERT_TRUE(engines[i]->Forward({&step, 1}, &decoded[i]).ok());
      engines[i]->FreeSequence(seq);
    }
    EXPECT_TRUE(SameBits(decoded[0].data(), decoded[1].data(), V)) << n;
  }
}

TEST(Quantization, CpuOnlyAndFlagParsing) {
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.device = "cuda";
  o.quantization = QuantFormat{4, 32, true};
  auto e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("CPU-only"), std::string::npos)
      << e.status();
  for (const char* good : {"int8", "int8-g32", "int4", "int4-g32",
                           "int4-g32-asym", "int4-pc", "int4-g64"}) {
    auto q = ParseQuantization(good);
    ASSERT_TRUE(q.ok() && q->has_value()) << good;
    EXPECT_EQ((*q)->ToString(), good);
  }
  // int8 defaults to one group per output channel (-pc says it again),
  // int4 to groups of 128.
  EXPECT_EQ(ParseQuantization("int8")->value().group_size, 0);
  EXPECT_EQ(ParseQuantization("int8-pc")->value().ToString(), "int8");
  EXPECT_EQ(ParseQuantization("int8-g32")->value().group_size, 32);
  EXPECT_EQ(ParseQuantization("int4")->value().group_size, 128);
  EXPECT_EQ(ParseQuantization("int4-g128")->value().ToString(), "int4");
  EXPECT_FALSE(ParseQuantization("none")->has_value());
  for (const char* bad : {"int3", "int4-g100", "int8-g0", "fp8", "int4-x"}) {
    EXPECT_FALSE(ParseQuantization(bad).ok()) << bad;
  }
}

// Decoding with int8 KV from a prefill on another engine continues exactly
// (the quantized path through the KV transfer).
TEST(Quantization, KvTransferAndInt8AgreesWithBf16) {
  auto bf16 = MakeEngine("models/stories260K", DType::kBF16);
  auto i8 = MakeEngine("models/stories260K", DType::kBF16, 2, 16, "int8");
  for (const auto& p : ReferencePrompts()) {
    auto a = LogitsAlone(*bf16, p), b = LogitsAlone(*i8, p);
    EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(),
              std::max_element(b.begin(), b.end()) - b.begin());
  }
}

// bf16 weights (and bf16 KV) against f32 on stories260K: the same greedy
// top-1 at the first position of each reference prompt, and every logit
// within 0.25 (logits span about +-12 here).
TEST(Bf16, StaysWithinToleranceOfF32) {
  auto f32 = MakeEngine("models/stories260K", DType::kF32);
  auto bf16 = MakeEngine("models/stories260K", DType::kBF16);
  const int V = f32->config().vocab_size;
  double worst = 0;
  for (const auto& p : ReferencePrompts()) {
    auto a = LogitsAlone(*f32, p), b = LogitsAlone(*bf16, p);
    EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(),
              std::max_element(b.begin(), b.end()) - b.begin());
    for (int i = 0; i < V; ++i)
      worst = std::max<double>(worst, std::fabs(a[i] - b[i]));
  }
  EXPECT_LT(worst, 0.25);
  EXPECT_GT(worst, 0.0);  // really ran in bf16
  std::printf("max |logit(bf16) - logit(f32)| = %.4f\n", worst);
}

// PDSERVE_BF16_KERNEL=amx (the engine_test_amx_bf16 run): every bf16
// product runs on AMX tiles, whose sums depend on the CPU, and the engine
// says so (numerics, hence the fingerprint a decode worker checks).
TEST(Bf16, AmxKernelOnlyWhenAskedAndNamedInTheNumerics) {
  const char* env = std::getenv("PDSERVE_BF16_KERNEL");
  const bool asked = env != nullptr && std::string(env) == "amx";
  if (asked && !CpuHasAmxBf16()) {
    GTEST_SKIP() << "this CPU has no AMX-BF16: the AMX kernel is not "
                    "exercised here";
  }
  auto f32 = MakeEngine("models/stories260K", DType::kF32);
  auto bf16 = MakeEngine("models/stories260K", DType::kBF16);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(bf16, nullptr);
  EXPECT_EQ(UseAmxBf16(), asked);
  EXPECT_EQ(bf16->numerics(), asked ? "bf16-amx" : "");
  EXPECT_EQ(f32->numerics(), "");
  std::printf("bf16 kernel: %s\n", asked ? "AMX" : "vdpbf16ps definition");
}

// ---- GenerationScheduler.
struct Collected {
  absl::Mutex mu;
  std::map<int, std::vector<int32_t>> outputs;
  std::map<int, std::string> reasons;
  int finished = 0;
};

TokenCallback Collect(Collected* c, int key) {
  return [c, key](const TokenEvent& e) {
    absl::MutexLock lock(&c->mu);
    if (e.has_token) c->outputs[key].push_back(e.token_id);
    if (e.finished) {
      c->reasons[key] = e.finish_reason;
      ++c->finished;
    }
  };
}

GenerationRequest Sampled(std::vector<int32_t> prompt, uint64_t seed,
                          int max_tokens) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.9f;
  r.sampling.top_p = 0.9f;
  r.sampling.top_k = 40;
  r.sampling.seed = seed;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

TEST(Scheduler, ReproducesReferenceConcurrently) {
  auto e = MakeEngine("models/stories260K", DType::kF32);
  const auto refs = LoadReferences();
  Collected c;
  {
    SchedulerOptions so;
    so.prefill_chunk_tokens =
        3;  // prompts arrive in chunks, mixed with decodes
    GenerationScheduler s(e.get(), so);
    for (size_t i = 0; i < refs.size(); ++i) {
      GenerationRequest r;
      r.prompt_ids = refs[i].prompt_ids;
      r.sampling.temperature = 0;
      r.stop.max_tokens = refs[i].max_new_tokens;
      ASSERT_TRUE(s.Submit(r, Collect(&c, i)).ok());
    }
    s.WaitIdle();
  }
  for (size_t i = 0; i < refs.size(); ++i) {
    EXPECT_EQ(c.outputs[i], refs[i].output_ids);
    EXPECT_EQ(c.reasons[i], refs[i].stop_reason == "bos" ? "stop" : "length");
  }
  EXPECT_EQ(e->free_blocks(), e->total_blocks());
}

// Seeded sampling: the same streams across runs and whatever runs beside them.
TEST(Scheduler, SeededSamplingIdenticalAcrossRunsAndCompositions) {
  auto e = MakeEngine("models/stories260K", DType::kF32);
  const auto prompts = ReferencePrompts();
  auto run = [&](const std::vector<size_t>& which, int max_num_seqs,
                 int chunk) {
    Collected c;
    SchedulerOptions so;
    so.max_num_seqs = max_num_seqs;
    so.prefill_chunk_tokens = chunk;
    GenerationScheduler s(e.get(), so);
    for (size_t i : which) {
      EXPECT_TRUE(
          s.Submit(Sampled(prompts[i % 3], 100 + i, 24), Collect(&c, i)).ok());
    }
    s.WaitIdle();
    absl::MutexLock lock(&c.mu);
    return c.outputs;
  };
  const auto alone0 = run({0}, 8, 0);
  const auto alone4 = run({4}, 8, 0);
  const auto together = run({0, 1, 2, 3, 4, 5}, 8, 0);
  const auto together_again = run({0, 1, 2, 3, 4, 5}, 8, 0);
  const auto serial = run({5, 4, 3, 2, 1, 0}, 2, 5);
  EXPECT_EQ(together, together_again);
  EXPECT_EQ(together.at(0), alone0.at(0));
  EXPECT_EQ(together.at(4), alone4.at(4));
  EXPECT_EQ(serial, together);
  EXPECT_NE(together.at(0), together.at(3));  // same prompt, other seed
  EXPECT_EQ(together.at(0).size(), 24u);
}

TEST(Scheduler, CancelFreesBlocksAndRejectsBadRequests) {
  auto e = MakeEngine("models/stories260K", DType::kF32);
  Collected c;
  GenerationScheduler s(e.get(), {});
  GenerationRequest bad;
  EXPECT_EQ(s.Submit(bad, Collect(&c, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.prompt_ids = {1, 999};
  bad.stop.max_tokens = 4;
  EXPECT_FALSE(s.Submit(bad, Collect(&c, 0)).ok());
  bad.prompt_ids = {1};
  bad.stop.max_tokens = 600;  // beyond max_position_embeddings (512)
  EXPECT_FALSE(s.Submit(bad, Collect(&c, 0)).ok());
  auto id = s.Submit(Sampled({1, 2}, 1, 400), Collect(&c, 1));
  ASSERT_TRUE(id.ok());
  s.Cancel(*id);
  s.WaitIdle();
  absl::MutexLock lock(&c.mu);
  EXPECT_EQ(c.reasons[1], "cancelled");
  EXPECT_LT(c.outputs[1].size(), 400u);
  EXPECT_EQ(e->free_blocks(), e->total_blocks());
}

// The decode worker's path: prefill on one engine, sample the first token
// there, import the KV into another engine, SubmitWithKv: same stream as one
// scheduler doing everything.
TEST(Scheduler, SubmitWithImportedKvContinuesTheSameStream) {
  auto p = MakeEngine("models/stories260K", DType::kF32);
  auto d = MakeEngine("models/stories260K", DType::kF32, 1, 8);
  const auto prompt = ReferencePrompts()[2];
  const GenerationRequest req = Sampled(prompt, 77, 20);
  Collected whole;
  {
    GenerationScheduler s(p.get(), {});
    ASSERT_TRUE(s.Submit(req, Collect(&whole, 0)).ok());
    s.WaitIdle();
  }
  SeqId sp = *p->CreateSequence();
  std::vector<float> logits;
  Engine::ForwardItem item{sp, prompt, true};
  ASSERT_TRUE(p->Forward({&item, 1}, &logits).ok());
  const int n = prompt.size();
  const SampledToken first = SampleToken(logits, req.sampling, prompt, {}, n);
  Collected rest;
  {
    GenerationScheduler s(d.get(), {});
    s.WithEngine([&](Engine& de) {
      SeqId sd = *de.CreateSequence();
      ASSERT_TRUE(de.Reserve(sd, n + 20).ok());
      for (int l = 0; l < de.config().num_layers; ++l) {
        std::string bytes;
        ASSERT_TRUE(p->ExportLayerKv(sp, l, 0, n, &bytes).ok());
        ASSERT_TRUE(de.ImportLayerKv(sd, l, 0, n, bytes).ok());
      }
      ASSERT_TRUE(de.SetSequenceLength(sd, n).ok());
      ASSERT_TRUE(s.SubmitWithKv(req, sd, first.id, Collect(&rest, 0)).ok());
    });
    s.WaitIdle();
  }
  std::vector<int32_t> combined = {first.id};
  combined.insert(combined.end(), rest.outputs[0].begin(),
                  rest.outputs[0].end());
  EXPECT_EQ(combined, whole.outputs[0]);
  EXPECT_EQ(rest.reasons[0], "length");
  EXPECT_EQ(d->free_blocks(), d->total_blocks());
}

// --kv_cache_memory: units, fractions of what is available, and what is
// refused: nonsense, fractions of 1 or more, and sizes above the memory this
// process can take (a pool that large was OOM-killed while being touched).
TEST(EngineOptions, MemorySizesParseAndOversizedOnesAreRefused) {
  EXPECT_EQ(*ParseMemorySize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseMemorySize(" 64mib "), int64_t{64} << 20);
  EXPECT_EQ(*ParseMemorySize("1.5GB"), int64_t{1500000000});
  EXPECT_EQ(*ParseMemorySize("1000000"), int64_t{1000000});
  EXPECT_EQ(*ParseMemorySize("4k"), int64_t{4096});
  auto available = AvailableMemoryNow();
  ASSERT_TRUE(available.ok());
  auto tenth = ParseMemorySize("0.1");
  ASSERT_TRUE(tenth.ok()) << tenth.status();
  EXPECT_GT(*tenth, 0);
  EXPECT_LE(*tenth, available->bytes / 5);  // a tenth, give or take churn
  for (const char* bad :
       {"", "abc", "0", "0.0", "-5MiB", "1.5", "2.0", "MiB", "inf", "nan"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseMemorySize(bad).status()))
        << "'" << bad << "'";
  }
  auto huge = ParseMemorySize("900TiB");
  EXPECT_TRUE(absl::IsResourceExhausted(huge.status())) << huge.status();
  EXPECT_NE(huge.status().message().find("MemAvailable"), std::string::npos);
}

// A model whose weights and KV pool cannot fit what this process may take
// is refused before anything is loaded (it ended in an OOM kill).
TEST(EngineOptions, ModelThatCannotFitIsRefusedBeforeLoading) {
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.kv_cache_bytes = int64_t{1} << 60;  // more than any machine has
  auto e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(e.status())) << e.status();
  EXPECT_NE(e.status().message().find("needs at least"), std::string::npos)
      << e.status();
  o.kv_cache_bytes = int64_t{1} << 20;
  EXPECT_TRUE(Engine::Create(o).ok());
}

// Scheduler options out of range are refused up front (max_num_seqs=0 once
// admitted nothing and hung every request).
TEST(Scheduler, OptionsOutOfRangeAreRefused) {
  EXPECT_TRUE(CheckSchedulerOptions(SchedulerOptions()).ok());
  auto refused = [](auto change) {
    SchedulerOptions o;
    change(o);
    return absl::IsInvalidArgument(CheckSchedulerOptions(o));
  };
  EXPECT_TRUE(refused([](SchedulerOptions& o) { o.max_num_seqs = 0; }));
  EXPECT_TRUE(refused([](SchedulerOptions& o) { o.max_batch_tokens = -1; }));
  EXPECT_TRUE(
      refused([](SchedulerOptions& o) { o.prefill_chunk_tokens = -1; }));
  EXPECT_TRUE(refused([](SchedulerOptions& o) { o.max_waiting = -1; }));
  EXPECT_TRUE(refused([](SchedulerOptions& o) { o.kv_watermark = 1.0; }));
  EXPECT_TRUE(refused([](SchedulerOptions& o) { o.kv_watermark = -0.1; }));
  EXPECT_FALSE(refused([](SchedulerOptions& o) { o.kv_watermark = 0; }));
}

}  // namespace
}  // namespace pdserve
