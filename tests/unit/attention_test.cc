// CPU attention (attention.h): tiled queries against a double-precision
// softmax, and every tiling and thread split of the context bit-identical
// to each query computed alone.
#include "common/backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common/backend/cpu/attention_avx2.h"
#include "common/backend/cpu/kernels.h"
#include "common/backend/cpu/packed_matrix.h"
#include "common/backend/cpu/simd_exp.h"
#include "common/kv/kv_cache.h"
#include "common/model/dtype.h"
#include "gtest/gtest.h"

// GCC 12 reports its own intrinsics' `__m512 __Y = __Y;` idiom (masked
// loads, conversions, reductions) as (maybe-)uninitialized once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve {
namespace {

// A pool holding one sequence of `len` random K/V rows in 2 layers.
struct AttentionFixture {
  std::unique_ptr<KvCache> kv;
  SeqId seq = 0;
  AttentionFixture(DType dtype, int head_dim, int block_size, int len,
                   std::mt19937& rng) {
    KvLayout layout;
    layout.num_layers = 2;
    layout.num_kv_heads = 2;
    layout.head_dim = head_dim;
    layout.block_size = block_size;
    layout.dtype = dtype;
    kv = std::move(*KvCache::Create(
        layout,
        layout.BytesPerBlock() * ((len + block_size - 1) / block_size + 2)));
    // A spare block first, so that block ids are not positions.
    const SeqId spare = kv->CreateSequence();
    EXPECT_TRUE(kv->Reserve(spare, 1).ok());
    seq = kv->CreateSequence();
    EXPECT_TRUE(kv->Reserve(seq, len).ok());
    kv->Free(spare);
    std::uniform_real_distribution<float> u(-2, 2);
    const int kvd = layout.num_kv_heads * head_dim;
    std::vector<float> row(kvd);
    std::vector<char> stored(kv->row_bytes());
    for (int l = 0; l < 2; ++l) {
      for (int p = 0; p < len; ++p) {
        for (int which = 0; which < 2; ++which) {
          for (auto& v : row) v = u(rng);
          StoreRow(row.data(), kvd, dtype, stored.data());
          kv->WriteRow(seq, l, which, p, stored.data());
        }
      }
    }
  }
  // Attention over layer 1, kv head 1 (what At reads), scaled 1/sqrt(D).
  AttentionArgs Args() const {
    AttentionArgs args{};
    args.kv = kv.get();
    args.table = kv->BlockTable(seq);
    args.layer = 1;
    args.kv_head = 1;
    args.head_dim = kv->layout().head_dim;
    args.scale = 1.0f / std::sqrt(static_cast<float>(args.head_dim));
    return args;
  }
  // Element i of kv head `h`'s K (which = 0) or V row at `pos`, layer 1.
  double At(int which, int pos, int h, int i) const {
    std::vector<char> row(kv->row_bytes());
    kv->ReadRow(seq, 1, which, pos, row.data());
    const int64_t at = int64_t{h} * kv->layout().head_dim + i;
    if (kv->layout().dtype == DType::kBF16) {
      uint16_t b;
      std::memcpy(&b, row.data() + 2 * at, 2);
      return Bf16ToF32(b);
    }
    float f;
    std::memcpy(&f, row.data() + 4 * at, 4);
    return f;
  }
};

// Queries of one sequence attended together (AttendHeads tiles share K/V
// loads) must give exactly what each gives alone, for any tile-mates and
// windows, and exactly what a split of the context into partition ranges
// gives (computed in any order, combined afterwards); and match a
// double-precision softmax.
void CheckAttention(DType dtype, int head_dim, int block_size) {
  constexpr int kLen = 300;  // three partitions
  std::mt19937 rng(head_dim * 7 + block_size + static_cast<int>(dtype));
  AttentionFixture f(dtype, head_dim, block_size, kLen, rng);
  std::uniform_real_distribution<float> u(-2, 2);
  const AttentionArgs args = f.Args();
  constexpr int kQueries = 11;
  std::vector<float> q(kQueries * head_dim);
  for (auto& v : q) v = u(rng);
  const std::string what = std::string(DTypeName(dtype)) + " head_dim " +
                           std::to_string(head_dim) + " block " +
                           std::to_string(block_size);
  for (int window : {0, 5, 140}) {
    // Queries at positions 250..260 (consecutive, as a prefill chunk), the
    // last two at 100 and 299 (other partitions, as other heads would be).
    std::vector<AttentionQuery> qs(kQueries);
    std::vector<float> tiled(kQueries * head_dim), alone(kQueries * head_dim),
        split(kQueries * head_dim);
    for (int g = 0; g < kQueries; ++g) {
      const int pos = g == 9 ? 100 : (g == 10 ? 299 : 250 + g);
      qs[g] = {q.data() + g * head_dim,
               window ? std::max(0, pos - window + 1) : 0, pos,
               tiled.data() + g * head_dim};
    }
    AttendHeads(args, qs.data(), kQueries);
    // The split: partitions [1, 3) first, then [0, 1), by other calls.
    const int stride = AttentionPartialFloats(head_dim);
    std::vector<std::vector<float>> partials(kQueries,
                                             std::vector<float>(3 * stride));
    std::vector<float*> ptrs;
    std::vector<AttentionQuery> sq = qs;
    for (int g = 0; g < kQueries; ++g) {
      ptrs.push_back(partials[g].data());
      sq[g].out = split.data() + g * head_dim;
    }
    AttendPartitions(args, sq.data(), ptrs.data(), kQueries, 1, 3);
    for (int g = kQueries - 1; g >= 0; --g) {
      AttendPartitions(args, &sq[g], &ptrs[g], 1, 0, 1);
    }
    for (int g = 0; g < kQueries; ++g) {
      CombineAttention(sq[g], head_dim, ptrs[g]);
    }
    for (int g = 0; g < kQueries; ++g) {
      AttentionQuery one = qs[g];
      one.out = alone.data() + g * head_dim;
      AttendHeads(args, &one, 1);
      // Double-precision reference.
      std::vector<double> s;
      double mx = -1e300;
      for (int p = one.first; p <= one.last; ++p) {
        double d = 0;
        for (int i = 0; i < head_dim; ++i) d += one.q[i] * f.At(0, p, 1, i);
        s.push_back(d * args.scale);
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double& v : s) sum += (v = std::exp(v - mx));
      for (int i = 0; i < head_dim; ++i) {
        double ref = 0;
        for (int p = one.first; p <= one.last; ++p) {
          ref += s[p - one.first] / sum * f.At(1, p, 1, i);
        }
        EXPECT_NEAR(alone[g * head_dim + i], ref, 1e-5)
            << what << " query " << g << " dim " << i << " window " << window;
      }
    }
    EXPECT_EQ(std::memcmp(tiled.data(), alone.data(), tiled.size() * 4), 0)
        << what << " window " << window;
    EXPECT_EQ(std::memcmp(split.data(), alone.data(), split.size() * 4), 0)
        << what << " window " << window;
    // A tile starting elsewhere (different tile-mates): same bits.
    std::vector<float> shifted(kQueries * head_dim);
    std::vector<AttentionQuery> rest(qs.begin() + 3, qs.end());
    for (int g = 0; g < static_cast<int>(rest.size()); ++g) {
      rest[g].out = shifted.data() + (g + 3) * head_dim;
    }
    AttendHeads(args, rest.data(), static_cast<int>(rest.size()));
    EXPECT_EQ(
        std::memcmp(shifted.data() + 3 * head_dim, alone.data() + 3 * head_dim,
                    (kQueries - 3) * head_dim * 4),
        0)
        << what << " window " << window;
  }
}

TEST(Attention, TilesAndSplitsAreBitIdenticalToSingleQueries) {
  for (int head_dim : {64, 128, 48, 256, 4}) {
    CheckAttention(DType::kF32, head_dim, 16);
    CheckAttention(DType::kBF16, head_dim, 16);
  }
  // Blocks shorter than, longer than and not dividing 16 positions.
  for (int block_size : {5, 8, 32, 200}) {
    CheckAttention(DType::kF32, 64, block_size);
    CheckAttention(DType::kBF16, 64, block_size);
  }
}

// attention.h's arithmetic written out one float at a time: whichever path
// this CPU (and the ctest variant's PDSERVE_DISABLE_* settings) runs,
// AVX-512, AVX2 or scalar, must give exactly these bits.
void CheckDocumentedBits(DType dtype, int head_dim, int block_size) {
  constexpr int kLen = 300;
  std::mt19937 rng(head_dim * 13 + block_size);
  AttentionFixture f(dtype, head_dim, block_size, kLen, rng);
  std::uniform_real_distribution<float> u(-2, 2);
  const AttentionArgs args = f.Args();
  std::vector<float> q(head_dim), out(head_dim), want(head_dim);
  for (auto& v : q) v = u(rng);
  for (auto [first, last] : {std::pair<int, int>{0, 299}, {0, 0}, {37, 250}}) {
    AttentionQuery one{q.data(), first, last, out.data()};
    AttendHeads(args, &one, 1);
    float max_all = -INFINITY;
    std::vector<std::vector<float>> parts;
    for (int p = AttentionPartitionOf(first); p <= AttentionPartitionOf(last);
         ++p) {
      const int vf = std::max(first, p * kAttentionPartition);
      const int vl = std::min(last, (p + 1) * kAttentionPartition - 1);
      std::vector<float> e;
      float mx = -INFINITY;
      for (int j = vf; j <= vl; ++j) {
        float s = 0;
        for (int d = 0; d < head_dim; ++d) {
          s = std::fma(q[d], static_cast<float>(f.At(0, j, 1, d)), s);
        }
        e.push_back(s * args.scale);
        mx = std::max(mx, e.back());
      }
      float lanes[16] = {};
      for (int j = vf; j <= vl; ++j) {
        e[j - vf] = ExpScalar(e[j - vf] - mx);
        lanes[j % 16] += e[j - vf];
      }
      std::vector<float> part = {mx, cpu_internal::LaneSum(lanes)};
      for (int d = 0; d < head_dim; ++d) {
        float acc = 0;
        for (int j = vf; j <= vl; ++j) {
          acc = std::fma(e[j - vf], static_cast<float>(f.At(1, j, 1, d)), acc);
        }
        part.push_back(acc);
      }
      max_all = std::max(max_all, mx);
      parts.push_back(part);
    }
    float sum = 0;
    std::fill(want.begin(), want.end(), 0.0f);
    for (const auto& part : parts) {
      const float w = ExpScalar(part[0] - max_all);
      sum = std::fma(w, part[1], sum);
      for (int d = 0; d < head_dim; ++d) {
        want[d] = std::fma(w, part[2 + d], want[d]);
      }
    }
    const float inv = 1.0f / sum;
    for (auto& v : want) v *= inv;
    EXPECT_EQ(std::memcmp(out.data(), want.data(), head_dim * 4), 0)
        << DTypeName(dtype) << " head_dim " << head_dim << " block "
        << block_size << " positions " << first << ".." << last;
  }
}

TEST(Attention, EveryPathComputesTheDocumentedBits) {
  // Head dims: whole 16-dimension pieces (64, 128), an odd number of
  // 8-dimension chunks (24, 8), and a partial chunk (20). Blocks: 16, 32
  // (16-position groups at an offset in a block) and 5 (groups cut short).
  for (int head_dim : {64, 20, 128, 24, 8}) {
    CheckDocumentedBits(DType::kF32, head_dim, 16);
    CheckDocumentedBits(DType::kBF16, head_dim, 16);
  }
  CheckDocumentedBits(DType::kF32, 64, 5);
  CheckDocumentedBits(DType::kBF16, 64, 5);
  CheckDocumentedBits(DType::kBF16, 64, 32);
  CheckDocumentedBits(DType::kBF16, 24, 32);
}

// The exponential's three forms agree bit for bit over the range softmax
// and SiLU use (the AVX forms where this CPU has them).
TEST(Exp, ScalarAvx2AndAvx512FormsAgree) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-100, 100);
  std::vector<float> xs = {0.0f,  -0.0f, -87.33654f, 88.72283f, -90.0f,
                           89.0f, 88.7f, -87.0f,     1e-8f,     -1e-8f};
  for (int i = 0; i < 20000; ++i) xs.push_back(u(rng));
  int avx2_diff = 0, avx512_diff = 0;
  for (float x : xs) {
    const float want = ExpScalar(x);
    if (CpuHasAvx2()) {
      const float got = TestOnlyExp256(x);
      if (std::memcmp(&got, &want, 4) != 0) ++avx2_diff;
    }
    if (CpuHasAvx512()) {
      const float got = TestOnlyExp512(x);
      if (std::memcmp(&got, &want, 4) != 0) ++avx512_diff;
    }
  }
  EXPECT_EQ(avx2_diff, 0);
  EXPECT_EQ(avx512_diff, 0);
}

}  // namespace
}  // namespace pdserve
