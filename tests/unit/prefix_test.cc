// Prefix caching: the KV pool's ref-counted sharing of registered full
// blocks, LRU eviction within the budget, immutability of cached blocks, the
// chained hashes; and the engine's exactness: a prompt sharing a 64-token
// prefix with an earlier one computes only the remainder (engine counters)
// and gets bit-identical logits and output, for f32 and bf16 KV.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/kv/kv_cache.h"
#include "common/kv/prefix_hash.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

KvLayout Layout() {
  KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 1;
  l.head_dim = 4;
  l.block_size = 4;
  l.dtype = DType::kF32;
  return l;
}

std::unique_ptr<KvCache> Pool(int blocks) {
  auto kv = KvCache::Create(Layout(), Layout().BytesPerBlock() * blocks);
  EXPECT_TRUE(kv.ok()) << kv.status();
  (*kv)->EnablePrefixCache(PrefixHashRoot("model", DType::kF32, 4));
  return std::move(*kv);
}

// A sequence holding `tokens` (KV rows filled with a token-derived pattern),
// recorded so that its full blocks are registered.
SeqId Computed(KvCache& kv, const std::vector<int32_t>& tokens) {
  SeqId s = kv.CreateSequence();
  EXPECT_TRUE(kv.Reserve(s, tokens.size()).ok());
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    for (int layer = 0; layer < 2; ++layer) {
      float k[4];
      for (int i = 0; i < 4; ++i) k[i] = tokens[pos] * 10 + layer + i;
      kv.WriteRow(s, layer, 0, pos, reinterpret_cast<const char*>(k));
    }
  }
  EXPECT_TRUE(kv.SetLength(s, tokens.size()).ok());
  EXPECT_TRUE(kv.RecordTokens(s, 0, tokens).ok());
  return s;
}

TEST(PrefixHash, ChainedAndKeyedByModelDtypeAndBlockSize) {
  const BlockHash root = PrefixHashRoot("m", DType::kF32, 4);
  EXPECT_NE(root, PrefixHashRoot("m2", DType::kF32, 4));
  EXPECT_NE(root, PrefixHashRoot("m", DType::kBF16, 4));
  EXPECT_NE(root, PrefixHashRoot("m", DType::kF32, 8));
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<int32_t> b = {9, 2, 3, 4, 5, 6, 7, 8};
  auto ha = FullBlockHashes(root, a, 4);
  auto hb = FullBlockHashes(root, b, 4);
  ASSERT_EQ(ha.size(), 2u);  // the partial third block is not hashed
  ASSERT_EQ(hb.size(), 2u);
  EXPECT_NE(ha[0], hb[0]);
  // Same tokens in block 1, different history: different hash.
  EXPECT_NE(ha[1], hb[1]);
  EXPECT_EQ(ha[1], ChainBlockHash(ha[0], {5, 6, 7, 8}));
  EXPECT_EQ(FullBlockHashes(root, a, 4, 1).size(), 1u);
  EXPECT_EQ(ha[0].ToHex().size(), 32u);
}

TEST(PrefixCache, SharesRegisteredBlocksAndKeepsThemAfterFree) {
  auto kv = Pool(8);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  SeqId a = Computed(*kv, t);  // 3 blocks, 2 full ones registered
  EXPECT_EQ(kv->used_blocks(), 3);
  EXPECT_EQ(kv->prefix_stats().cached_blocks, 2);
  EXPECT_EQ(kv->prefix_stats().evictable_blocks, 0);

  SeqId b = kv->CreateSequence();
  std::vector<int32_t> tb = {1, 2, 3, 4, 5, 6, 7, 8, 42, 43, 44, 45};
  auto reused = kv->AttachPrefix(b, tb, 11);
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(*reused, 8);
  EXPECT_EQ(kv->Length(b), 8);
  EXPECT_EQ((*kv->BlockTable(b))[0], (*kv->BlockTable(a))[0]);
  EXPECT_EQ((*kv->BlockTable(b))[1], (*kv->BlockTable(a))[1]);
  EXPECT_EQ(kv->used_blocks(), 3);  // shared, not copied
  // The shared rows are the ones `a` computed.
  std::string ka(kv->row_bytes(), '\0'), kb = ka;
  kv->ReadRow(a, 1, 0, 6, ka.data());
  kv->ReadRow(b, 1, 0, 6, kb.data());
  EXPECT_EQ(ka, kb);
  EXPECT_EQ(reinterpret_cast<const float*>(kb.data())[0], 7 * 10 + 1);
  // max_tokens bounds the reuse: 7 tokens cover one full block only.
  SeqId c = kv->CreateSequence();
  EXPECT_EQ(*kv->AttachPrefix(c, tb, 7), 4);
  // A divergent second block: only the first is shared.
  SeqId d = kv->CreateSequence();
  EXPECT_EQ(*kv->AttachPrefix(d, {1, 2, 3, 4, 5, 6, 0, 8, 9}, 9), 4);
  // A different first token: nothing.
  SeqId e = kv->CreateSequence();
  EXPECT_EQ(*kv->AttachPrefix(e, {0, 2, 3, 4, 5, 6, 7, 8, 9}, 9), 0);
  // Only empty sequences attach.
  EXPECT_EQ(kv->AttachPrefix(a, t, 9).status().code(),
            absl::StatusCode::kFailedPrecondition);

  kv->Free(a);  // its private partial block returns; shared ones stay used
  EXPECT_EQ(kv->used_blocks(), 2);
  for (SeqId s : {b, c, d, e}) kv->Free(s);
  EXPECT_EQ(kv->used_blocks(), 0);
  EXPECT_EQ(kv->free_blocks(), kv->total_blocks());
  const PrefixCacheStats st = kv->prefix_stats();
  EXPECT_EQ(st.cached_blocks, 2);
  EXPECT_EQ(st.evictable_blocks, 2);
  EXPECT_EQ(st.queries, 4);
  EXPECT_EQ(st.hit_tokens, 8 + 4 + 4);

  // Still attachable after every sequence is gone.
  SeqId f = kv->CreateSequence();
  EXPECT_EQ(*kv->AttachPrefix(f, t, 9), 8);
  EXPECT_EQ(kv->prefix_stats().evictable_blocks, 0);
  kv->Free(f);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedOnlyWhenBlankBlocksRunOut) {
  auto kv = Pool(5);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8};
  kv->Free(Computed(*kv, t));  // 2 cached, 3 blank
  EXPECT_EQ(kv->free_blocks(), 5);
  SeqId big = kv->CreateSequence();
  ASSERT_TRUE(kv->Reserve(big, 12).ok());  // the 3 blank blocks
  EXPECT_EQ(kv->prefix_stats().evictions, 0);
  EXPECT_EQ(kv->prefix_stats().cached_blocks, 2);
  ASSERT_TRUE(kv->Reserve(big, 16).ok());  // evicts the chain's tail first
  EXPECT_EQ(kv->prefix_stats().evictions, 1);
  EXPECT_EQ(kv->free_blocks(), 1);
  SeqId s = kv->CreateSequence();
  EXPECT_EQ(*kv->AttachPrefix(s, t, 8), 4);  // the head survived
  EXPECT_EQ(kv->free_blocks(), 0);
  SeqId x = kv->CreateSequence();
  EXPECT_EQ(kv->Reserve(x, 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv->used_blocks(), kv->total_blocks());  // never above budget
  for (SeqId q : {big, s, x}) kv->Free(q);
  EXPECT_EQ(kv->used_blocks(), 0);
}

TEST(PrefixCache, CachedBlocksAreImmutable) {
  auto kv = Pool(8);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8};
  SeqId a = Computed(*kv, t);
  SeqId b = kv->CreateSequence();
  ASSERT_EQ(*kv->AttachPrefix(b, t, 8), 8);
  // Rewriting a shared block (by shrinking into it) is refused.
  EXPECT_EQ(kv->SetLength(b, 5).code(), absl::StatusCode::kFailedPrecondition);
  // So is importing into a registered block.
  ASSERT_TRUE(kv->Reserve(b, 12).ok());
  std::string bytes(2 * 4 * kv->row_bytes(), '\0');
  EXPECT_EQ(kv->ImportLayer(b, 0, 4, 8, bytes).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(kv->ImportLayer(b, 0, 8, 12, bytes).ok());
  kv->Free(b);
  // A block of one sequence alone is unregistered when shrunk into.
  ASSERT_TRUE(kv->SetLength(a, 6).ok());
  EXPECT_EQ(kv->prefix_stats().cached_blocks, 1);
  kv->Free(a);
  SeqId c = kv->CreateSequence();
  EXPECT_EQ(*kv->AttachPrefix(c, t, 8), 4);
  kv->Free(c);
  EXPECT_EQ(kv->used_blocks(), 0);
}

// ---- Engine: reuse is exact.
std::unique_ptr<Engine> MakeEngine(bool prefix_cache, DType kv_dtype) {
  EngineOptions o;
  o.model = "models/stories260K";
  o.kv_dtype = kv_dtype;
  o.kv_cache_bytes = 16 << 20;
  o.num_threads = 2;
  o.max_batch_tokens = 512;
  o.enable_prefix_caching = prefix_cache;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Prefill `prompt` (after attaching what the cache holds) and decode `steps`
// greedy tokens; returns the prompt's last logits and the tokens.
struct GenRun {
  int reused = 0;
  int64_t computed = 0;  // tokens run through Forward for the prompt
  std::vector<float> logits;
  std::vector<int32_t> tokens;
};
GenRun Generate(Engine& e, const std::vector<int32_t>& prompt, int steps) {
  GenRun run;
  SeqId s = *e.CreateSequence();
  auto reused = e.AttachCachedPrefix(s, prompt);
  EXPECT_TRUE(reused.ok()) << reused.status();
  run.reused = *reused;
  const int64_t before = e.stats().forward_tokens;
  Engine::ForwardItem item{s, absl::MakeConstSpan(prompt).subspan(run.reused),
                           true};
  EXPECT_TRUE(e.Forward({&item, 1}, &run.logits).ok());
  run.computed = e.stats().forward_tokens - before;
  std::vector<float> logits = run.logits;
  for (int i = 0; i < steps; ++i) {
    run.tokens.push_back(Argmax(logits));
    Engine::ForwardItem next{s, absl::MakeConstSpan(&run.tokens.back(), 1),
                             true};
    EXPECT_TRUE(e.Forward({&next, 1}, &logits).ok());
  }
  e.FreeSequence(s);
  return run;
}

void CheckSharedPrefixReuse(DType kv_dtype) {
  auto cached = MakeEngine(true, kv_dtype);
  auto plain = MakeEngine(false, kv_dtype);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(3, 511);
  std::vector<int32_t> prefix(64);
  for (auto& t : prefix) t = tok(rng);
  std::vector<int32_t> first = prefix, second = prefix;
  for (int i = 0; i < 7; ++i) first.push_back(tok(rng));
  for (int i = 0; i < 11; ++i) second.push_back(tok(rng));

  const GenRun a = Generate(*cached, first, 20);
  EXPECT_EQ(a.reused, 0);
  EXPECT_EQ(a.computed, 71);
  const GenRun b = Generate(*cached, second, 20);
  EXPECT_EQ(b.reused, 64);
  EXPECT_EQ(b.computed, 11);  // only the remainder
  const GenRun want = Generate(*plain, second, 20);
  EXPECT_EQ(want.reused, 0);
  EXPECT_EQ(want.computed, 75);
  ASSERT_EQ(b.logits.size(), want.logits.size());
  EXPECT_EQ(std::memcmp(b.logits.data(), want.logits.data(),
                        b.logits.size() * sizeof(float)),
            0);
  EXPECT_EQ(b.tokens, want.tokens);
  EXPECT_EQ(a.tokens, Generate(*plain, first, 20).tokens);

  // A prompt that IS the cached prefix: one block is left to compute so
  // that the pass yields logits.
  const GenRun c = Generate(*cached, prefix, 5);
  EXPECT_EQ(c.reused, 48);
  EXPECT_EQ(c.computed, 16);
  EXPECT_EQ(c.tokens, Generate(*plain, prefix, 5).tokens);

  const EngineStats st = cached->stats();
  EXPECT_EQ(st.prefix.queries, 3);
  EXPECT_EQ(st.prefix.hit_tokens, 64 + 48);
  EXPECT_GE(st.prefix.cached_blocks, 4);
  // Leak check: nothing referenced; cached blocks count as free.
  EXPECT_EQ(cached->used_blocks(), 0);
  EXPECT_EQ(cached->free_blocks(), cached->total_blocks());
  EXPECT_EQ(plain->used_blocks(), 0);
  EXPECT_EQ(plain->stats().prefix.cached_blocks, 0);
}

TEST(EnginePrefixCache, SharedPrefixComputesOnlyTheRestF32Kv) {
  CheckSharedPrefixReuse(DType::kF32);
}
TEST(EnginePrefixCache, SharedPrefixComputesOnlyTheRestBf16Kv) {
  CheckSharedPrefixReuse(DType::kBF16);
}

TEST(EnginePrefixCache, PublishedImportedKvIsAttachable) {
  auto src = MakeEngine(false, DType::kF32);
  auto dst = MakeEngine(true, DType::kF32);
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = 5 + i;
  SeqId s = *src->CreateSequence();
  std::vector<float> logits;
  Engine::ForwardItem item{s, prompt, true};
  ASSERT_TRUE(src->Forward({&item, 1}, &logits).ok());
  SeqId d = *dst->CreateSequence();
  ASSERT_TRUE(dst->Reserve(d, 40).ok());
  for (int l = 0; l < dst->config().num_layers; ++l) {
    std::string bytes;
    ASSERT_TRUE(src->ExportLayerKv(s, l, 0, 40, &bytes).ok());
    ASSERT_TRUE(dst->ImportLayerKv(d, l, 0, 40, bytes).ok());
  }
  ASSERT_TRUE(dst->SetSequenceLength(d, 40).ok());
  EXPECT_FALSE(dst->PublishPrefix(d, std::vector<int32_t>(41, 1)).ok());
  ASSERT_TRUE(dst->PublishPrefix(d, prompt).ok());
  EXPECT_EQ(dst->stats().prefix.cached_blocks, 2);
  dst->FreeSequence(d);
  src->FreeSequence(s);
  const GenRun r = Generate(*dst, prompt, 8);
  EXPECT_EQ(r.reused, 32);
  EXPECT_EQ(r.tokens, Generate(*src, prompt, 8).tokens);
  EXPECT_EQ(dst->used_blocks(), 0);
  EXPECT_EQ(src->used_blocks(), 0);
}

}  // namespace
}  // namespace pdserve
