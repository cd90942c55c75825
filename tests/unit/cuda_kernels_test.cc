// Every CUDA kernel against the CPU kernels on random inputs. Needs a GPU
// (label gpu); skips cleanly without one. NOT YET RUN ON A GPU.
//
// Tolerances: f32 outputs within 1e-5 relative (+1e-6 absolute) for the
// elementwise kernels and 1e-4 for attention (different exp and summation
// order); bf16 values within one bf16 ulp (~1e-2 relative); the gather,
// bias/residual adds, the bf16 conversion and argmax are exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/backend/cpu/attention.h"
#include "common/backend/cpu/kernels.h"
#include "common/backend/cuda/cuda_device.h"
#include "common/backend/cuda/cuda_util.h"
#include "common/backend/cuda/kernels.cuh"
#include "common/kv/kv_cache.h"
#include "common/model/config.h"

namespace pdserve {
namespace {

#define SKIP_WITHOUT_GPU()                                           \
  do {                                                               \
    const absl::Status s = CheckCudaDevice();                        \
    if (!s.ok()) GTEST_SKIP() << "no GPU, skipped: " << s.message(); \
  } while (0)

std::vector<float> Random(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A device copy of a host vector, and back.
template <typename T>
cuda::DevicePtr Upload(const std::vector<T>& v) {
  auto d = cuda::DeviceAlloc(v.size() * sizeof(T), "test");
  EXPECT_TRUE(d.ok());
  EXPECT_EQ(cudaMemcpy(d->get(), v.data(), v.size() * sizeof(T),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  return std::move(*d);
}
template <typename T>
std::vector<T> Download(const cuda::DevicePtr& d, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(
      cudaMemcpy(v.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost),
      cudaSuccess);
  return v;
}
template <typename T>
T* Ptr(const cuda::DevicePtr& d) {
  return static_cast<T*>(d.get());
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 double rel, double abs, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 10; ++i) {
    if (!(std::fabs(got[i] - want[i]) <= abs + rel * std::fabs(want[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
      ++bad;
    }
  }
}

TEST(CudaKernels, EmbeddingGatherF32AndBf16Exact) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  const int V = 50, H = 70;
  std::vector<float> table = Random(rng, V * H);
  std::vector<uint16_t> table16(table.size());
  for (size_t i = 0; i < table.size(); ++i) table16[i] = F32ToBf16(table[i]);
  std::vector<int32_t> tokens = {3, 49, 0, 3, 17};
  const int T = tokens.size();
  auto d_tokens = Upload(tokens);
  auto out = *cuda::DeviceAlloc(T * H * 4, "out");
  for (bool bf16 : {false, true}) {
    auto d_table = bf16 ? Upload(table16) : Upload(table);
    ASSERT_EQ(cuda::EmbeddingGather(d_table.get(), bf16, Ptr<int32_t>(d_tokens),
                                    T, H, Ptr<float>(out), nullptr),
              cudaSuccess);
    std::vector<float> got = Download<float>(out, T * H);
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < H; ++i) {
        const float want = bf16 ? Bf16ToF32(table16[tokens[t] * H + i])
                                : table[tokens[t] * H + i];
        ASSERT_EQ(got[t * H + i], want) << t << "," << i;
      }
    }
  }
}

TEST(CudaKernels, RmsNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  const int R = 7, H = 333;
  std::vector<float> x = Random(rng, R * H, 3.0f), w = Random(rng, H);
  std::vector<float> want(R * H);
  for (int r = 0; r < R; ++r) {
    RmsNorm(x.data() + r * H, w.data(), H, 1e-5f, want.data() + r * H);
  }
  auto dx = Upload(x), dw = Upload(w);
  auto out = *cuda::DeviceAlloc(R * H * 4, "out");
  ASSERT_EQ(cuda::RmsNorm(Ptr<float>(dx), H, nullptr, R, H, Ptr<float>(dw),
                          1e-5f, Ptr<float>(out), nullptr),
            cudaSuccess);
  ExpectClose(Download<float>(out, R * H), want, 1e-5, 1e-6, "rmsnorm");
  // Gathered rows (the final norm of the wanted rows).
  std::vector<int32_t> rows = {6, 0, 3};
  auto drows = Upload(rows);
  ASSERT_EQ(cuda::RmsNorm(Ptr<float>(dx), H, Ptr<int32_t>(drows), 3, H,
                          Ptr<float>(dw), 1e-5f, Ptr<float>(out), nullptr),
            cudaSuccess);
  std::vector<float> want_rows;
  for (int r : rows) {
    want_rows.insert(want_rows.end(), want.begin() + r * H,
                     want.begin() + (r + 1) * H);
  }
  ExpectClose(Download<float>(out, 3 * H), want_rows, 1e-5, 1e-6, "rows");
}

TEST(CudaKernels, SiluMulAddsAndBf16Conversion) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  const int T = 5, I = 300;
  std::vector<float> gu = Random(rng, T * 2 * I, 4.0f);
  std::vector<float> want(T * I);
  for (int t = 0; t < T; ++t) {
    SiluMul(gu.data() + t * 2 * I, gu.data() + t * 2 * I + I, I,
            want.data() + t * I);
  }
  auto dgu = Upload(gu);
  auto out = *cuda::DeviceAlloc(T * I * 4, "out");
  ASSERT_EQ(cuda::SiluMul(Ptr<float>(dgu), T, I, Ptr<float>(out), nullptr),
            cudaSuccess);
  ExpectClose(Download<float>(out, T * I), want, 1e-5, 1e-6, "silu");

  std::vector<float> x = Random(rng, T * I), y = Random(rng, T * I),
                     b = Random(rng, I);
  auto dx = Upload(x), dy = Upload(y), db = Upload(b);
  ASSERT_EQ(cuda::AddInPlace(Ptr<float>(dx), Ptr<float>(dy), T * I, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::AddBias(Ptr<float>(dx), I, Ptr<float>(db), T, I, nullptr),
            cudaSuccess);
  std::vector<float> got = Download<float>(dx, T * I);
  for (int i = 0; i < T * I; ++i) ASSERT_EQ(got[i], (x[i] + y[i]) + b[i % I]);

  auto d16 = *cuda::DeviceAlloc(T * I * 2, "bf16");
  ASSERT_EQ(cuda::F32ToBf16(Ptr<float>(dx), T * I, Ptr<uint16_t>(d16), nullptr),
            cudaSuccess);
  std::vector<uint16_t> got16 = Download<uint16_t>(d16, T * I);
  for (int i = 0; i < T * I; ++i) ASSERT_EQ(got16[i], F32ToBf16(got[i]));
}

TEST(CudaKernels, ArgmaxRowsExactWithTies) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  const int R = 4, V = 32000;
  std::vector<float> logits = Random(rng, R * V);
  logits[1 * V + 7] = 100.0f;
  logits[1 * V + 9000] = 100.0f;  // tie: the lower index wins
  auto d = Upload(logits);
  auto out = *cuda::DeviceAlloc(R * 4, "out");
  ASSERT_EQ(cuda::ArgmaxRows(Ptr<float>(d), R, V, Ptr<int32_t>(out), nullptr),
            cudaSuccess);
  std::vector<int32_t> got = Download<int32_t>(out, R);
  for (int r = 0; r < R; ++r) {
    const float* row = logits.data() + r * V;
    EXPECT_EQ(got[r], std::max_element(row, row + V) - row) << r;
  }
}

// One token's K or V row (f32) into the host pool in `dtype`.
void StoreHostRow(KvCache& kv, SeqId seq, int layer, int which, int pos,
                  const float* row) {
  const KvLayout& l = kv.layout();
  std::vector<char> stored(kv.row_bytes());
  StoreRow(row, l.num_kv_heads * l.head_dim, l.dtype, stored.data());
  kv.WriteRow(seq, layer, which, pos, stored.data());
}

// The host pool in the device mirror's layout (the host pool's own layout is
// the CPU kernels'): [block][layer][K|V][block_size][kv_heads * head_dim].
std::vector<char> DeviceImage(const KvCache& kv) {
  const KvLayout& l = kv.layout();
  std::vector<char> image(kv.total_blocks() * l.BytesPerBlock());
  char* at = image.data();
  for (int32_t b = 0; b < kv.total_blocks(); ++b) {
    for (int layer = 0; layer < l.num_layers; ++layer) {
      for (int which = 0; which < 2; ++which) {
        for (int off = 0; off < l.block_size; ++off) {
          kv.ReadBlockRow(b, layer, which, off, at);
          at += kv.row_bytes();
        }
      }
    }
  }
  return image;
}

// A host KvCache with random K/V for a few sequences, mirrored on the device.
struct PagedFixture {
  std::unique_ptr<KvCache> kv;
  std::vector<SeqId> seqs;
  cuda::DevicePtr pool;
  cuda::KvPoolView view;

  PagedFixture(DType dtype, const std::vector<int>& lengths, int layers,
               int kv_heads, int head_dim, std::mt19937& rng) {
    KvLayout layout;
    layout.num_layers = layers;
    layout.num_kv_heads = kv_heads;
    layout.head_dim = head_dim;
    layout.block_size = 16;
    layout.dtype = dtype;
    kv = *KvCache::Create(layout, 8 << 20);
    const int kvd = kv_heads * head_dim;
    // Interleave reservations so block tables are not contiguous.
    for (size_t i = 0; i < lengths.size(); ++i)
      seqs.push_back(kv->CreateSequence());
    for (int step = 16;; step += 16) {
      bool more = false;
      for (size_t i = 0; i < lengths.size(); ++i) {
        if (kv->Capacity(seqs[i]) < lengths[i]) {
          EXPECT_TRUE(kv->Reserve(seqs[i], std::min(step, lengths[i])).ok());
          more = true;
        }
      }
      if (!more) break;
    }
    for (size_t i = 0; i < lengths.size(); ++i) {
      EXPECT_TRUE(kv->SetLength(seqs[i], lengths[i]).ok());
      for (int l = 0; l < layers; ++l) {
        for (int p = 0; p < lengths[i]; ++p) {
          std::vector<float> k = Random(rng, kvd), v = Random(rng, kvd);
          StoreHostRow(*kv, seqs[i], l, 0, p, k.data());
          StoreHostRow(*kv, seqs[i], l, 1, p, v.data());
        }
      }
    }
    const int64_t bytes = kv->total_blocks() * layout.BytesPerBlock();
    pool = *cuda::DeviceAlloc(bytes, "pool");
    const std::vector<char> image = DeviceImage(*kv);
    EXPECT_EQ(
        cudaMemcpy(pool.get(), image.data(), bytes, cudaMemcpyHostToDevice),
        cudaSuccess);
    view.base = pool.get();
    view.num_layers = layers;
    view.block_size = 16;
    view.num_kv_heads = kv_heads;
    view.head_dim = head_dim;
    view.bf16 = dtype == DType::kBF16;
  }
};

void CheckRopeAndStore(DType dtype) {
  std::mt19937 rng(5);
  const int heads = 4, kv_heads = 2, D = 64, T = 9;
  const int Q = heads * D, KVD = kv_heads * D, NQKV = Q + 2 * KVD;
  PagedFixture f(dtype, {40, 20}, 2, kv_heads, D, rng);
  ModelConfig config;
  config.head_dim = D;
  config.rope_theta = 500000.0;
  config.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  const std::vector<float> inv_freq = RopeInvFreq(config);
  std::vector<float> qkv = Random(rng, T * NQKV);
  std::vector<int32_t> pos, blocks, offs;
  std::vector<std::pair<SeqId, int>> where;
  for (int t = 0; t < T; ++t) {
    // RoPE positions up to ~7000 (large angles); distinct KV rows.
    const int s = t % 2;
    const int p_in_seq = s == 0 ? 30 + t / 2 : 15 + t / 2;
    pos.push_back(7 + 911 * t);
    where.push_back({f.seqs[s], p_in_seq});
    const auto* table = f.kv->BlockTable(f.seqs[s]);
    blocks.push_back((*table)[p_in_seq / 16]);
    offs.push_back(p_in_seq % 16);
  }
  auto dqkv = Upload(qkv), dpos = Upload(pos), db = Upload(blocks),
       doff = Upload(offs), dfreq = Upload(inv_freq);
  const int layer = 1;
  ASSERT_EQ(cuda::RopeAndStoreKv(Ptr<float>(dqkv), Ptr<int32_t>(dpos),
                                 Ptr<int32_t>(db), Ptr<int32_t>(doff), T, heads,
                                 Ptr<float>(dfreq), f.view, layer, nullptr),
            cudaSuccess);
  std::vector<float> want = qkv;
  std::vector<float> cs(D / 2), sn(D / 2);
  for (int t = 0; t < T; ++t) {
    RopeAngles(inv_freq, pos[t], cs.data(), sn.data());
    ApplyRope(want.data() + t * NQKV, heads, D, cs.data(), sn.data());
    ApplyRope(want.data() + t * NQKV + Q, kv_heads, D, cs.data(), sn.data());
    StoreHostRow(*f.kv, where[t].first, layer, 0, where[t].second,
                 want.data() + t * NQKV + Q);
    StoreHostRow(*f.kv, where[t].first, layer, 1, where[t].second,
                 want.data() + t * NQKV + Q + KVD);
  }
  ExpectClose(Download<float>(dqkv, T * NQKV), want, 1e-5, 1e-6, "rope");
  // The device pool now equals the host pool (bf16: within one ulp).
  const int64_t bytes = f.kv->total_blocks() * f.kv->layout().BytesPerBlock();
  std::vector<char> got = Download<char>(f.pool, bytes);
  const std::vector<char> image = DeviceImage(*f.kv);
  const char* host = image.data();
  const int esize = DTypeSize(dtype);
  std::vector<float> g, h;
  for (int64_t i = 0; i < bytes / esize; ++i) {
    float a, b;
    if (dtype == DType::kBF16) {
      uint16_t x, y;
      std::memcpy(&x, got.data() + 2 * i, 2);
      std::memcpy(&y, host + 2 * i, 2);
      a = Bf16ToF32(x);
      b = Bf16ToF32(y);
    } else {
      std::memcpy(&a, got.data() + 4 * i, 4);
      std::memcpy(&b, host + 4 * i, 4);
    }
    g.push_back(a);
    h.push_back(b);
  }
  ExpectClose(g, h, dtype == DType::kBF16 ? 8e-3 : 1e-5, 1e-6, "kv pool");
}

TEST(CudaKernels, RopeAndStoreKvMatchesCpuF32) {
  SKIP_WITHOUT_GPU();
  CheckRopeAndStore(DType::kF32);
}
TEST(CudaKernels, RopeAndStoreKvMatchesCpuBf16) {
  SKIP_WITHOUT_GPU();
  CheckRopeAndStore(DType::kBF16);
}

// Prefill chunks (tiles of several rows) and decode rows over paged KV, with
// and without a sliding window, GQA, against the CPU's AttendHeads. Decode
// rows longer than `split_keys` are split along the keys (0: never).
void CheckAttention(DType dtype, int head_dim, int window, int split_keys = 0) {
  std::mt19937 rng(6);
  const int heads = 8, kv_heads = 2, layers = 2, layer = 1;
  const std::vector<int> lengths = {1, 37, 100, 16, 300, 64};
  const std::vector<int> chunk = {1, 20, 1, 16, 1, 1};  // last positions
  PagedFixture f(dtype, lengths, layers, kv_heads, head_dim, rng);
  const int Q = heads * head_dim, NQKV = Q + 2 * kv_heads * head_dim;
  std::vector<cuda::AttentionTile> tiles;
  std::vector<int32_t> tables;
  struct RowInfo {
    size_t seq;
    int pos;
  };
  std::vector<RowInfo> rows;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const auto* table = f.kv->BlockTable(f.seqs[s]);
    const int offset = tables.size();
    tables.insert(tables.end(), table->begin(), table->end());
    const int pos0 = lengths[s] - chunk[s];
    const int row0 = rows.size();
    for (int t = 0; t < chunk[s]; ++t) rows.push_back({s, pos0 + t});
    for (int t = 0; t < chunk[s]; t += cuda::kAttentionRowsPerTile) {
      tiles.push_back({row0 + t,
                       std::min(cuda::kAttentionRowsPerTile, chunk[s] - t),
                       pos0 + t, offset});
    }
  }
  const int T = rows.size();
  std::vector<float> qkv = Random(rng, T * NQKV);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> want(T * Q);
  for (int r = 0; r < T; ++r) {
    for (int h = 0; h < heads; ++h) {
      AttentionArgs a;
      a.kv = f.kv.get();
      a.table = f.kv->BlockTable(f.seqs[rows[r].seq]);
      a.layer = layer;
      a.kv_head = h / (heads / kv_heads);
      a.head_dim = head_dim;
      a.scale = scale;
      AttentionQuery q;
      q.q = qkv.data() + r * NQKV + h * head_dim;
      q.last = rows[r].pos;
      q.first = window > 0 ? std::max(0, rows[r].pos - window + 1) : 0;
      q.out = want.data() + r * Q + h * head_dim;
      AttendHeads(a, &q, 1);
    }
  }
  std::vector<int32_t> tile_ints(tiles.size() * 4);
  std::memcpy(tile_ints.data(), tiles.data(), tile_ints.size() * 4);
  auto dqkv = Upload(qkv), dtiles = Upload(tile_ints), dtables = Upload(tables);
  auto out = *cuda::DeviceAlloc(T * Q * 4, "out");
  const cuda::AttentionSplitPlan plan =
      cuda::PlanAttentionSplits(tiles, split_keys);
  if (split_keys > 0) {
    // Rows at positions 99 and 299 (and 63 when splits are 32 keys).
    ASSERT_GE(plan.slots, 2) << "the split path is not exercised";
  }
  auto dbase = Upload(plan.base);
  auto partial = *cuda::DeviceAlloc(
      std::max<int64_t>(1, plan.slots) * heads * (head_dim + 2) * 4, "partial");
  ASSERT_EQ(cuda::Attention(
                Ptr<float>(dqkv), NQKV,
                reinterpret_cast<const cuda::AttentionTile*>(dtiles.get()),
                tiles.size(), Ptr<int32_t>(dtables), f.view, layer, heads,
                window, scale, Ptr<float>(out), nullptr,
                plan.slots > 0 ? Ptr<int32_t>(dbase) : nullptr, plan.max_splits,
                split_keys, Ptr<float>(partial)),
            cudaSuccess);
  ExpectClose(Download<float>(out, T * Q), want, 1e-4, 1e-5, "attention");
}

TEST(CudaKernels, AttentionMatchesCpuF32) {
  SKIP_WITHOUT_GPU();
  CheckAttention(DType::kF32, 64, 0);
}
TEST(CudaKernels, AttentionMatchesCpuBf16Head128) {
  SKIP_WITHOUT_GPU();
  CheckAttention(DType::kBF16, 128, 0);
}
TEST(CudaKernels, AttentionSlidingWindow) {
  SKIP_WITHOUT_GPU();
  CheckAttention(DType::kF32, 64, 24);
}
// Decode rows split along the keys (flash-decoding) give the CPU's result;
// with a window, splits wholly before it are empty and skipped.
TEST(CudaKernels, AttentionSplitDecodeRowsMatchCpu) {
  SKIP_WITHOUT_GPU();
  CheckAttention(DType::kF32, 64, 0, 32);
  CheckAttention(DType::kBF16, 128, 0, 64);
  CheckAttention(DType::kF32, 128, 0, cuda::kAttentionSplitKeys);
}
TEST(CudaKernels, AttentionSplitWithSlidingWindow) {
  SKIP_WITHOUT_GPU();
  CheckAttention(DType::kF32, 64, 24, 32);
  CheckAttention(DType::kF32, 64, 70, 32);
}
// A decode row's result does not depend on how many other rows share its
// pass, split or not: the same bits as that row alone.
TEST(CudaKernels, AttentionSplitRowIsBatchInvariant) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  const int heads = 4, kv_heads = 2, head_dim = 64, layers = 1;
  const std::vector<int> lengths = {700, 33, 290};
  PagedFixture f(DType::kBF16, lengths, layers, kv_heads, head_dim, rng);
  const int Q = heads * head_dim, NQKV = Q + 2 * kv_heads * head_dim;
  std::vector<int32_t> tables;
  std::vector<cuda::AttentionTile> all;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const auto* table = f.kv->BlockTable(f.seqs[s]);
    all.push_back({static_cast<int32_t>(s), 1, lengths[s] - 1,
                   static_cast<int32_t>(tables.size())});
    tables.insert(tables.end(), table->begin(), table->end());
  }
  std::vector<float> qkv = Random(rng, lengths.size() * NQKV);
  const float scale = 0.125f;
  auto run = [&](std::vector<cuda::AttentionTile> tiles) {
    std::vector<int32_t> ints(tiles.size() * 4);
    std::memcpy(ints.data(), tiles.data(), ints.size() * 4);
    const cuda::AttentionSplitPlan plan =
        cuda::PlanAttentionSplits(tiles, cuda::kAttentionSplitKeys);
    auto dqkv = Upload(qkv), dtiles = Upload(ints), dtables = Upload(tables);
    auto dbase = Upload(plan.base);
    auto partial = *cuda::DeviceAlloc(
        std::max<int64_t>(1, plan.slots) * heads * (head_dim + 2) * 4, "p");
    auto out = *cuda::DeviceAlloc(lengths.size() * Q * 4, "out");
    cudaMemset(out.get(), 0, lengths.size() * Q * 4);
    EXPECT_EQ(
        cuda::Attention(
            Ptr<float>(dqkv), NQKV,
            reinterpret_cast<const cuda::AttentionTile*>(dtiles.get()),
            tiles.size(), Ptr<int32_t>(dtables), f.view, 0, heads, 0, scale,
            Ptr<float>(out), nullptr,
            plan.slots > 0 ? Ptr<int32_t>(dbase) : nullptr, plan.max_splits,
            cuda::kAttentionSplitKeys, Ptr<float>(partial)),
        cudaSuccess);
    return Download<float>(out, lengths.size() * Q);
  };
  const std::vector<float> together = run(all);
  for (size_t s = 0; s < lengths.size(); ++s) {
    const std::vector<float> alone = run({all[s]});
    EXPECT_EQ(std::memcmp(alone.data() + s * Q, together.data() + s * Q,
                          Q * sizeof(float)),
              0)
        << "row " << s << " (position " << lengths[s] - 1 << ")";
  }
}
TEST(CudaKernels, AttentionHeadDim256UsesLargeSharedMemory) {
  SKIP_WITHOUT_GPU();
  CheckAttention(DType::kF32, 256, 0);
}

}  // namespace
}  // namespace pdserve
