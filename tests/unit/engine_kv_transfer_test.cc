// The KV handoff between two engines (what a prefill worker ships to a
// decode worker): every layer exported from one engine and imported into
// another continues bit-identically, including large imports that take
// non-temporal stores; fingerprints tell models, dtypes and quantizations
// apart.
#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/engine.h"
#include "common/kv/kv_cache.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_util.h"

namespace pdserve {
namespace {

using testing_util::MakeEngine;
using testing_util::ReferencePrompts;
using testing_util::SameBits;

// Greedy decoding of `steps` tokens on A's sequence and on B's (which holds
// the KV A shipped), from A's logits `la` of the prompt: the logits must be
// bit-identical at every step.
void DecodeBothAndCompare(Engine& a, SeqId sa, Engine& b, SeqId sb,
                          std::vector<float> la, int steps) {
  const int V = a.config().vocab_size;
  std::vector<float> lb;
  for (int step = 0; step < steps; ++step) {
    const int32_t tok = static_cast<int32_t>(
        std::max_element(la.begin(), la.begin() + V) - la.begin());
    Engine::ForwardItem ia{sa, absl::MakeConstSpan(&tok, 1), true};
    Engine::ForwardItem ib{sb, absl::MakeConstSpan(&tok, 1), true};
    ASSERT_TRUE(a.Forward({&ia, 1}, &la).ok());
    ASSERT_TRUE(b.Forward({&ib, 1}, &lb).ok());
    ASSERT_TRUE(SameBits(la.data(), lb.data(), V)) << "step " << step;
  }
}

// Prefill on engine A, ship every layer's KV to engine B (another pool with
// another block size), decode on B: identical to decoding on A.
void CheckKvTransfer(DType dtype) {
  auto a = MakeEngine("models/stories260K", dtype, 2, 16);
  auto b = MakeEngine("models/stories260K", dtype, 1, 8);
  ASSERT_EQ(a->fingerprint(), b->fingerprint());
  const auto prompt = ReferencePrompts()[1];
  SeqId sa = *a->CreateSequence();
  std::vector<float> la;
  Engine::ForwardItem item{sa, prompt, true};
  std::vector<int> layers_done;
  ASSERT_TRUE(a->Forward({&item, 1}, &la, [&](int layer) {
                 layers_done.push_back(layer);
               }).ok());
  EXPECT_EQ(layers_done.size(), static_cast<size_t>(a->config().num_layers));
  SeqId sb = *b->CreateSequence();
  const int n = static_cast<int>(prompt.size());
  ASSERT_TRUE(b->Reserve(sb, n + 20).ok());
  for (int layer = 0; layer < a->config().num_layers; ++layer) {
    std::string bytes;
    ASSERT_TRUE(a->ExportLayerKv(sa, layer, 0, n, &bytes).ok());
    EXPECT_EQ(static_cast<int64_t>(bytes.size()),
              n * a->kv_layout().BytesPerTokenPerLayer());
    // Two pieces, as a transfer in chunks would.
    const size_t half_tokens = n / 2;
    const size_t row = a->kv_layout().BytesPerTokenPerLayer() / 2;
    std::string first, second;
    ASSERT_TRUE(a->ExportLayerKv(sa, layer, 0, half_tokens, &first).ok());
    ASSERT_TRUE(a->ExportLayerKv(sa, layer, half_tokens, n, &second).ok());
    EXPECT_EQ(first.substr(0, half_tokens * row),
              bytes.substr(0, half_tokens * row));
    ASSERT_TRUE(b->ImportLayerKv(sb, layer, 0, half_tokens, first).ok());
    ASSERT_TRUE(b->ImportLayerKv(sb, layer, half_tokens, n, second).ok());
  }
  ASSERT_TRUE(b->SetSequenceLength(sb, n).ok());
  DecodeBothAndCompare(*a, sa, *b, sb, la, 12);
}

TEST(KvTransfer, ExportImportContinuesBitIdenticallyF32) {
  CheckKvTransfer(DType::kF32);
}
TEST(KvTransfer, ExportImportContinuesBitIdenticallyBf16) {
  CheckKvTransfer(DType::kBF16);
}

// A long prompt's KV at a real model's head size: each layer's import is
// one chunk of 1 MiB or more, which D's pool takes with non-temporal stores
// (KvCache::ImportStores), whole blocks through the streaming transposes.
// Decoding on B after it must match A bit for bit.
TEST(KvTransfer, LargeImportsWithStreamingStoresContinueBitIdentically) {
  auto a = MakeEngine("synthetic:llama-110m", DType::kBF16, 2, 16);
  auto b = MakeEngine("synthetic:llama-110m", DType::kBF16, 2, 16);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(a->fingerprint(), b->fingerprint());
  const int V = a->config().vocab_size;
  std::vector<int32_t> prompt(400);
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % V);
  }
  const int n = static_cast<int>(prompt.size());
  const int64_t chunk = n * a->kv_layout().BytesPerTokenPerLayer();
  if (std::getenv("PDSERVE_KV_STREAMING_IMPORT") == nullptr) {
    ASSERT_EQ(KvCache::ImportStores(chunk), Stores::kStreaming) << chunk;
  }
  SeqId sa = *a->CreateSequence();
  std::vector<float> la;
  Engine::ForwardItem item{sa, prompt, true};
  ASSERT_TRUE(a->Forward({&item, 1}, &la).ok());
  SeqId sb = *b->CreateSequence();
  ASSERT_TRUE(b->Reserve(sb, n + 8).ok());
  for (int layer = 0; layer < a->config().num_layers; ++layer) {
    std::string bytes;
    ASSERT_TRUE(a->ExportLayerKv(sa, layer, 0, n, &bytes).ok());
    ASSERT_EQ(static_cast<int64_t>(bytes.size()), chunk);
    ASSERT_TRUE(b->ImportLayerKv(sb, layer, 0, n, bytes).ok());
  }
  ASSERT_TRUE(b->SetSequenceLength(sb, n).ok());
  for (int layer = 0; layer < a->config().num_layers; ++layer) {
    std::string sent, back;
    ASSERT_TRUE(a->ExportLayerKv(sa, layer, 0, n, &sent).ok());
    ASSERT_TRUE(b->ExportLayerKv(sb, layer, 0, n, &back).ok());
    ASSERT_TRUE(back == sent) << "layer " << layer;
  }
  DecodeBothAndCompare(*a, sa, *b, sb, la, 4);
}

// What a prefill worker does between layers (PrefillWorker::
// ExportLayerChunks): the compute threads seal a layer's chunks at once,
// each into its own buffer, in both store kinds. Every chunk equals, byte
// for byte and checksum, the export made afterwards on one thread; every
// index runs once, and with two threads both take part (ParallelFor splits
// by index, not timing).
TEST(KvTransfer, ChunksSealedInParallelBetweenLayersEqualOneThreadsExports) {
  auto a = MakeEngine("models/stories260K", DType::kF32, 2, 16);
  ASSERT_NE(a, nullptr);
  for (int n : {0, 1, 2, 3, 17}) {
    std::vector<int> runs(n, 0);
    a->ForEachParallel(n, [&](int i) { ++runs[i]; });
    EXPECT_EQ(std::count(runs.begin(), runs.end(), 1), n) << n;
  }
  const auto prompts = ReferencePrompts();
  std::vector<SeqId> seqs;
  std::vector<Engine::ForwardItem> items;
  for (int p = 0; p < 2; ++p) {
    seqs.push_back(*a->CreateSequence());
    items.push_back({seqs.back(), prompts[p], true});
  }
  struct Chunk {
    SeqId seq = 0;
    int layer = 0, begin = 0, end = 0;
    Stores stores = Stores::kCached;
    std::string bytes;
    uint64_t xxh3 = 0;
    std::thread::id thread;
  };
  std::vector<Chunk> chunks;
  const int64_t bpt = a->kv_layout().BytesPerTokenPerLayer();
  std::vector<float> logits;
  ASSERT_TRUE(
      a->Forward(items, &logits, [&](int layer) {
         std::vector<Chunk> layer_chunks;
         for (size_t p = 0; p < items.size(); ++p) {
           const int len = static_cast<int>(items[p].tokens.size());
           for (int b = 0; b < len; b += 5) {
             const int e = std::min(len, b + 5);
             Chunk& c = layer_chunks.emplace_back();
             c.seq = items[p].seq;
             c.layer = layer;
             c.begin = b;
             c.end = e;
             c.stores = b % 2 == 0 ? Stores::kCached : Stores::kStreaming;
             c.bytes.assign(bpt * (e - b), '\0');
           }
         }
         a->ForEachParallel(static_cast<int>(layer_chunks.size()), [&](int i) {
           Chunk& c = layer_chunks[i];
           c.thread = std::this_thread::get_id();
           ASSERT_TRUE(a->ExportLayerKv(c.seq, c.layer, c.begin, c.end,
                                        absl::MakeSpan(c.bytes), &c.xxh3,
                                        c.stores)
                           .ok());
         });
         for (Chunk& c : layer_chunks) chunks.push_back(std::move(c));
       }).ok());
  ASSERT_FALSE(chunks.empty());
  std::set<std::thread::id> threads;
  for (const Chunk& c : chunks) {
    std::string bytes;
    uint64_t xxh3 = 0;
    ASSERT_TRUE(
        a->ExportLayerKv(c.seq, c.layer, c.begin, c.end, &bytes, &xxh3).ok());
    EXPECT_TRUE(bytes == c.bytes)
        << "layer " << c.layer << " [" << c.begin << ", " << c.end << ")";
    EXPECT_EQ(xxh3, c.xxh3);
    threads.insert(c.thread);
  }
  EXPECT_EQ(threads.size(), 2u);
}

TEST(KvTransfer, FingerprintDiffersAcrossModelsAndDtypes) {
  auto a = MakeEngine("models/stories260K", DType::kF32);
  auto b = MakeEngine("models/stories260K", DType::kBF16);
  auto c = MakeEngine("synthetic:tiny", DType::kF32);
  EXPECT_EQ(a->fingerprint().size(), 32u);
  EXPECT_NE(a->fingerprint(), b->fingerprint());
  EXPECT_NE(a->fingerprint(), c->fingerprint());
  // Quantization is part of the numerics: each format its own fingerprint.
  auto i8 = MakeEngine("models/stories260K", DType::kBF16, 2, 16, "int8");
  auto i4 = MakeEngine("models/stories260K", DType::kBF16, 2, 16, "int4");
  auto i4g = MakeEngine("models/stories260K", DType::kBF16, 2, 16, "int4-g32");
  auto i8again = MakeEngine("models/stories260K", DType::kBF16, 1, 8, "int8");
  EXPECT_NE(i8->fingerprint(), b->fingerprint());
  EXPECT_NE(i8->fingerprint(), i4->fingerprint());
  EXPECT_NE(i4->fingerprint(), i4g->fingerprint());
  EXPECT_EQ(i8->fingerprint(), i8again->fingerprint());
}

}  // namespace
}  // namespace pdserve
