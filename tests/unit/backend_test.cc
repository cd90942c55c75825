// CPU backend: the packed matmul against a double-precision product, its
// row invariance (a row's result is bit-identical alone or among any other
// rows, with any thread count), the quantized matmul against its written-out
// arithmetic, and the thread pool's static split. (Attention:
// attention_test.cc.)
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/backend/cpu/bf16_amx.h"
#include "common/backend/cpu/packed_matrix.h"
#include "common/backend/cpu/quantized_amx.h"
#include "common/backend/cpu/quantized_matrix.h"
#include "common/backend/thread_pool.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(ThreadPool, CoversTheRangeOnceWithStaticSplit) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 10, 1001}) {
    std::vector<int> hits(n, 0);
    std::vector<int> owner(n, -1);
    pool.ParallelFor(n, [&](int64_t b, int64_t e, int t) {
      for (int64_t i = b; i < e; ++i) {
        ++hits[i];
        owner[i] = t;
      }
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i], 1);
    if (n == 1) continue;  // run inline by the caller
    for (int t = 0; t < 3; ++t) {
      for (int64_t i = n * t / 3; i < n * (t + 1) / 3; ++i) {
        EXPECT_EQ(owner[i], t) << n;
      }
    }
  }
}

// Many short calls on more threads than this machine has cores (as `up`
// now runs workers on small hosts: they share the cores): every range still
// runs exactly once per call, with its own index, and no two running calls
// share a range index.
TEST(ThreadPool, EachRangeRunsOnceWhenThreadsOutnumberCores) {
  const int threads =
      2 * static_cast<int>(std::thread::hardware_concurrency()) + 1;
  ThreadPool pool(threads);
  std::vector<std::atomic<int>> running(threads);
  std::atomic<bool> shared_index{false};
  for (int call = 0; call < 3000; ++call) {
    const int64_t n = 1 + call % 37;
    std::vector<std::atomic<int>> hits(n);
    std::vector<std::atomic<int>> index_of(n);
    pool.ParallelFor(n, [&](int64_t b, int64_t e, int r) {
      if (running[r].fetch_add(1) != 0) shared_index = true;
      for (int64_t i = b; i < e; ++i) {
        hits[i].fetch_add(1);
        index_of[i].store(r);
      }
      if (call % 100 == 0) std::this_thread::yield();
      running[r].fetch_sub(1);
    });
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(hits[i].load(), 1) << "call " << call << " element " << i;
      if (n > 1) {
        const int r = index_of[i].load();
        ASSERT_TRUE(i >= n * r / threads && i < n * (r + 1) / threads)
            << "call " << call << " element " << i << " range " << r;
      }
    }
  }
  EXPECT_FALSE(shared_index.load());
}

void CheckMatMul(DType dtype, int64_t N, int64_t K) {
  std::mt19937 rng(N * 1000 + K);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w(N * K), x(13 * K), bias(N);
  for (auto& v : w) v = u(rng);
  for (auto& v : x) v = u(rng);
  for (auto& v : bias) v = u(rng);
  PackedMatrix pm(N, K, dtype);
  WeightView view{DType::kF32, {N, K}, w.data()};
  pm.PackRows(0, view);
  // Reference in double with the weights as packed (bf16-rounded).
  std::vector<float> row(K);
  ThreadPool pool1(1), pool3(3);
  std::vector<float> all(13 * N);
  MatMul(pool3, x.data(), 13, K, pm, bias.data(), all.data(), N);
  for (int64_t n = 0; n < N; ++n) {
    pm.GetRow(n, row.data());
    for (int64_t k = 0; k < K; ++k) {
      const float want =
          dtype == DType::kBF16 ? RoundToBf16(w[n * K + k]) : w[n * K + k];
      ASSERT_EQ(row[k], want);
    }
    for (int m = 0; m < 13; ++m) {
      // bf16: the activations are rounded to bf16 at the product.
      double ref = bias[n];
      for (int64_t k = 0; k < K; ++k) {
        const float xv =
            dtype == DType::kBF16 ? RoundToBf16(x[m * K + k]) : x[m * K + k];
        ref += static_cast<double>(xv) * row[k];
      }
      EXPECT_NEAR(all[m * N + n], ref, 1e-4 * std::sqrt(K)) << m << "," << n;
    }
  }
  // Any subset of rows, alone or with neighbours, 1 or 3 threads: same bits.
  for (int m0 = 0; m0 < 13; m0 += 4) {
    for (int rows : {1, 2, 5, 7}) {
      if (m0 + rows > 13) continue;
      std::vector<float> part(rows * N);
      MatMul((rows % 2) ? pool1 : pool3, x.data() + m0 * K, rows, K, pm,
             bias.data(), part.data(), N);
      EXPECT_EQ(std::memcmp(part.data(), all.data() + m0 * N, rows * N * 4), 0)
          << "rows " << m0 << "+" << rows;
    }
  }
}

// Weight buffers: small ones share slabs, each 4 KiB aligned and apart
// from every other live one (also when threads allocate at once), large
// ones are their own; all writable, all freed without a trace.
TEST(WeightBuffers, SlabsHandOutDisjointAlignedBuffers) {
  std::vector<std::pair<AlignedBuffer, int64_t>> held;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const int64_t bytes = 1 + (int64_t{i * 7919 + t * 104729} % (3 << 20));
        AlignedBuffer b = AllocateWeights(bytes);
        ASSERT_NE(b.get(), nullptr);
        std::memset(b.get(), t, bytes);
        std::lock_guard<std::mutex> lock(mu);
        held.emplace_back(std::move(b), bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  held.emplace_back(AllocateWeights(kWeightSlabBytes), kWeightSlabBytes);
  EXPECT_EQ(held.back().first.get_deleter().slab, nullptr);  // its own
  std::sort(held.begin(), held.end(), [](const auto& a, const auto& b) {
    return a.first.get() < b.first.get();
  });
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(held[i].first.get()) % 4096, 0u);
    if (i + 1 < held.size()) {
      EXPECT_LE(held[i].first.get() + held[i].second, held[i + 1].first.get());
    }
  }
  held.clear();
  // A slab whose buffers are all gone is not kept: the next buffer starts a
  // fresh one at its beginning (2 MiB aligned when huge pages are wanted).
  AlignedBuffer again = AllocateWeights(100);
  ASSERT_NE(again.get(), nullptr);
  EXPECT_NE(again.get_deleter().slab, nullptr);
  EXPECT_EQ(again.get(), again.get_deleter().slab.get());
}

TEST(MatMul, F32MatchesReferenceAndIsRowInvariant) {
  CheckMatMul(DType::kF32, 100, 37);
  CheckMatMul(DType::kF32, 64, 300);
  CheckMatMul(DType::kF32, 1, 5);
}

TEST(MatMul, Bf16MatchesReferenceAndIsRowInvariant) {
  CheckMatMul(DType::kBF16, 100, 37);
  CheckMatMul(DType::kBF16, 130, 513);
}

// The bf16 kernel computes exactly vdpbf16ps' definition (Bf16PairDot per
// pair of k, high half first, DAZ/FTZ), whether the CPU has the instruction
// or not: checked bit-for-bit against the scalar definition, with values
// spanning the subnormal range so that DAZ/FTZ matter.
// f32: one FMA per k in increasing k, whichever kernel runs (AVX-512,
// AVX2 or scalar: the ctest variants disable the wider ones).
TEST(MatMul, F32IsExactlyTheFmaChain) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto [M, K] :
       {std::pair<int64_t, int64_t>{1, 601}, {7, 601}, {13, 75}, {2, 3}}) {
    const int64_t N = 70;
    std::vector<float> w(N * K), x(M * K);
    for (auto& v : w) v = u(rng);
    for (auto& v : x) v = u(rng);
    PackedMatrix pm(N, K, DType::kF32);
    pm.PackRows(0, WeightView{DType::kF32, {N, K}, w.data()});
    ThreadPool pool(2);
    std::vector<float> y(M * N);
    MatMul(pool, x.data(), M, K, pm, nullptr, y.data(), N);
    int mismatches = 0;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        float acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          acc = std::fma(x[m * K + k], w[n * K + k], acc);
        }
        if (std::memcmp(&acc, &y[m * N + n], 4) != 0) ++mismatches;
      }
    }
    EXPECT_EQ(mismatches, 0) << "M " << M << " K " << K;
  }
}

TEST(MatMul, Bf16IsExactlyThePairDotDefinition) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::uniform_int_distribution<int> ex(-140, 10);
  // M = 1 and 9: the decode-sized and the larger products, whose kernels
  // are chosen separately (UseVdpbf16ps).
  // K = 601: past the AVX2 kernel's K blocks (partial sums through y).
  for (auto [tiny, M, K] : {std::tuple<bool, int64_t, int64_t>{false, 9, 75},
                            {true, 9, 75},
                            {false, 1, 75},
                            {true, 1, 75},
                            {false, 7, 601},
                            {false, 1, 601}}) {
    const int64_t N = 70;
    std::vector<float> w(N * K), x(M * K);
    auto value = [&] {
      return tiny ? std::ldexp(u(rng), ex(rng) / 2 - 60) : u(rng);
    };
    for (auto& v : w) v = value();
    for (auto& v : x) v = value();
    PackedMatrix pm(N, K, DType::kBF16);
    pm.PackRows(0, WeightView{DType::kF32, {N, K}, w.data()});
    ThreadPool pool(2);
    std::vector<float> y(M * N);
    MatMul(pool, x.data(), M, K, pm, nullptr, y.data(), N);
    std::vector<uint32_t> xp((K + 1) / 2), wp((K + 1) / 2);
    std::vector<float> row(K);
    int mismatches = 0;
    for (int64_t m = 0; m < M; ++m) {
      RoundToBf16Pairs(x.data() + m * K, K, xp.data());
      for (int64_t j = 0; j < (K + 1) / 2; ++j) {
        ASSERT_EQ(xp[j] & 0xffffu, F32ToBf16(x[m * K + 2 * j]));
      }
      for (int64_t n = 0; n < N; ++n) {
        pm.GetRow(n, row.data());
        RoundToBf16Pairs(row.data(), K, wp.data());
        float acc = 0;
        for (int64_t j = 0; j < (K + 1) / 2; ++j) {
          acc = Bf16PairDot(acc, xp[j], wp[j]);
        }
        if (std::memcmp(&acc, &y[m * N + n], 4) != 0) ++mismatches;
      }
    }
    EXPECT_EQ(mismatches, 0)
        << "tiny " << tiny << " native " << CpuHasAvx512Bf16();
  }
}

// Rows in any grouping give the same bits, across the AMX kernel's 16-row
// tiles too (up to 40 rows: tiles, a partial tile, single rows), with k
// not a multiple of the tiles' 32 (a zero-padded tail) and a partial panel.
TEST(MatMul, Bf16RowsInvariantAcrossTiles) {
  for (const int64_t K : {75, 1030}) {
    const int64_t N = 70, M = 40;
    std::mt19937 rng(K);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> w(N * K), x(M * K);
    for (auto& v : w) v = u(rng);
    for (auto& v : x) v = u(rng);
    PackedMatrix pm(N, K, DType::kBF16);
    pm.PackRows(0, WeightView{DType::kF32, {N, K}, w.data()});
    ThreadPool pool1(1), pool3(3);
    std::vector<float> all(M * N);
    MatMul(pool3, x.data(), M, K, pm, nullptr, all.data(), N);
    for (auto [m0, rows] : {std::pair<int64_t, int64_t>{0, 1},
                            {0, 15},
                            {0, 16},
                            {0, 17},
                            {3, 33},
                            {20, 20},
                            {39, 1},
                            {7, 9}}) {
      std::vector<float> part(rows * N);
      MatMul(rows % 2 ? pool1 : pool3, x.data() + m0 * K, rows, K, pm, nullptr,
             part.data(), N);
      EXPECT_EQ(std::memcmp(part.data(), all.data() + m0 * N, rows * N * 4), 0)
          << "K " << K << " rows " << m0 << "+" << rows;
    }
  }
}

// Which bf16 kernel runs: PDSERVE_BF16_KERNEL forces one (vdpbf16ps only
// where the CPU has it, amx only where it has AMX-BF16); unset, the faster
// of vdpbf16ps and its emulation here.
TEST(MatMul, Bf16KernelChoiceFollowsTheEnvironment) {
  const char* env = std::getenv("PDSERVE_BF16_KERNEL");
  const std::string choice = env == nullptr ? "" : env;
  if (choice == "amx" && !CpuHasAmxBf16()) {
    GTEST_SKIP() << "this CPU has no AMX-BF16: the AMX kernel is not "
                    "exercised here";
  }
  EXPECT_EQ(UseAmxBf16(), choice == "amx");
  for (int64_t rows : {1, 64}) {
    if (choice == "vdpbf16ps") {
      EXPECT_EQ(UseVdpbf16ps(rows), CpuHasAvx512Bf16());
    } else if (choice == "fma") {
      EXPECT_FALSE(UseVdpbf16ps(rows));
    } else {
      EXPECT_TRUE(!UseVdpbf16ps(rows) || CpuHasAvx512Bf16());
    }
    std::printf(
        "CPU has vdpbf16ps: %d, AMX-BF16: %d; bf16 kernel for %d "
        "rows: %s\n",
        CpuHasAvx512Bf16(), CpuHasAmxBf16(), static_cast<int>(rows),
        UseAmxBf16()         ? "AMX"
        : UseVdpbf16ps(rows) ? "vdpbf16ps"
                             : "two FMAs per pair");
  }
}

// ---- Quantized matrices.

// The documented arithmetic of QuantMatMul, written out independently: each
// row quantized in blocks of 32, per block an exact integer dot product with
// the codes, acc = fma(float(isum - zero * sum q), scale * s, acc).
std::vector<float> QuantReference(const QuantizedMatrix& w,
                                  const std::vector<float>& x, int64_t M) {
  const int64_t K = w.k(), N = w.n();
  const int64_t G =
      w.format().group_size > 0 ? w.format().group_size : (K + 31) / 32 * 32;
  const int64_t blocks = w.groups() * G / 32;
  std::vector<float> y(M * N);
  for (int64_t m = 0; m < M; ++m) {
    std::vector<int> q(blocks * 32, 0);
    std::vector<float> s(blocks);
    std::vector<int> qsum(blocks, 0);
    for (int64_t b = 0; b < blocks; ++b) {
      float amax = 0;
      for (int64_t k = b * 32; k < std::min(K, b * 32 + 32); ++k) {
        amax = std::max(amax, std::fabs(x[m * K + k]));
      }
      const float inv = amax > 0 ? 127.0f / amax : 0.0f;
      s[b] = amax / 127.0f;
      for (int64_t k = b * 32; k < std::min(K, b * 32 + 32); ++k) {
        q[k] = static_cast<int>(std::nearbyint(x[m * K + k] * inv));
        qsum[b] += q[k];
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t g = b * 32 / G;
        int isum = 0;
        for (int64_t k = b * 32; k < std::min(K, b * 32 + 32); ++k) {
          isum += w.Code(n, k) * q[k];
        }
        // Padding past K holds zero weights: code == zero point, q == 0.
        const float v = static_cast<float>(isum - w.Zero(n, g) * qsum[b]);
        acc = std::fma(v, w.Scale(n, g) * s[b], acc);
      }
      y[m * N + n] = acc;
    }
  }
  return y;
}

void CheckQuantMatMul(const std::string& spec, int64_t N, int64_t K,
                      int64_t M = 11) {
  auto format = ParseQuantization(spec);
  ASSERT_TRUE(format.ok() && format->has_value()) << spec;
  std::mt19937 rng(N * 31 + K);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w(N * K), x(M * K), bias(N);
  for (auto& v : w) v = u(rng);
  for (auto& v : x) v = u(rng) * (1 + 3 * (u(rng) > 0.9f));  // some outliers
  for (auto& v : bias) v = u(rng);
  QuantizedMatrix qm(N, K, **format);
  for (int64_t n = 0; n < N; ++n) qm.QuantizeRow(n, w.data() + n * K);
  // Dequantized weights within half a step of the originals (int8
  // symmetric); a step where the range clips (int4 symmetric maps the
  // largest magnitude to -8, so +8 steps clip to +7) or the zero point is
  // rounded (asymmetric).
  const int64_t G = qm.format().group_size;
  const float bound =
      qm.format().symmetric && qm.format().bits == 8 ? 0.5f : 1.0f;
  std::vector<float> row(K);
  for (int64_t n = 0; n < N; ++n) {
    qm.GetRow(n, row.data());
    for (int64_t k = 0; k < K; ++k) {
      const float step = std::fabs(qm.Scale(n, k / G));
      ASSERT_LE(std::fabs(row[k] - w[n * K + k]), bound * step * 1.001f + 1e-7f)
          << spec << " n " << n << " k " << k;
    }
  }
  ThreadPool pool1(1), pool3(3);
  std::vector<float> all(M * N);
  QuantMatMul(pool3, x.data(), M, K, qm, nullptr, all.data(), N);
  const std::vector<float> ref = QuantReference(qm, x, M);
  EXPECT_EQ(std::memcmp(all.data(), ref.data(), all.size() * 4), 0)
      << spec << " M " << M << ": differs from the documented arithmetic";
  // Close to the f32 product with the dequantized weights (activations are
  // quantized to 8 bits: ~1% of the magnitude).
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      qm.GetRow(n, row.data());
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        exact += static_cast<double>(x[m * K + k]) * row[k];
        mag += std::fabs(static_cast<double>(x[m * K + k]) * row[k]);
      }
      EXPECT_NEAR(all[m * N + n], exact, 0.02 * mag + 1e-6) << spec;
    }
  }
  // Bias, subsets of rows, 1 or 3 threads: same bits.
  std::vector<float> with_bias(M * N);
  QuantMatMul(pool1, x.data(), M, K, qm, bias.data(), with_bias.data(), N);
  for (int64_t i = 0; i < M * N; ++i) {
    ASSERT_EQ(with_bias[i], all[i] + bias[i % N]);
  }
  for (int m0 = 0; m0 < M; m0 += 3) {
    for (int rows : {1, 2, 4, 7, 17}) {
      if (m0 + rows > M) continue;
      std::vector<float> part(rows * N);
      QuantMatMul((rows % 2) ? pool1 : pool3, x.data() + m0 * K, rows, K, qm,
                  nullptr, part.data(), N);
      EXPECT_EQ(std::memcmp(part.data(), all.data() + m0 * N, rows * N * 4), 0)
          << spec << " rows " << m0 << "+" << rows;
    }
  }
}

// Each kernel this CPU can run (scalar, AVX2, VNNI, AMX-INT8), forced for every
// row count, must give the documented arithmetic's bits.
class QuantKernelTest : public ::testing::TestWithParam<QuantKernel> {
 protected:
  void SetUp() override {
    if (!ForceQuantKernel(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the kernel (AMX-INT8: "
                   << CpuHasAmxInt8() << ", AVX512-VNNI: " << CpuHasAvx512Vnni()
                   << ", AVX2: " << CpuHasAvx2() << ")";
    }
  }
  void TearDown() override { ForceQuantKernel(QuantKernel::kAuto); }
};

TEST_P(QuantKernelTest, Int8MatchesDefinitionAndIsRowInvariant) {
  CheckQuantMatMul("int8", 100, 75);
  CheckQuantMatMul("int8", 64, 256, 40);
  CheckQuantMatMul("int8-g32", 70, 200, 33);
  CheckQuantMatMul("int8-g64-asym", 65, 130, 20);
}

TEST_P(QuantKernelTest, Int4MatchesDefinitionAndIsRowInvariant) {
  CheckQuantMatMul("int4", 100, 75);
  CheckQuantMatMul("int4-g32", 130, 300, 40);
  CheckQuantMatMul("int4-g32-asym", 64, 96, 33);
  CheckQuantMatMul("int4-g128-asym", 70, 256, 20);
}

// The integer sums at their extremes: codes 0 and 2^bits - 1 against
// activation codes +-127 and values whose nibbles are all ones (the AVX2
// one-row int8 kernel splits activations into nibbles and holds a block's
// low-nibble sums as unsigned 16-bit, up to 61200), every row count.
void CheckExtremeQuantSums(const std::string& spec) {
  auto format = ParseQuantization(spec);
  ASSERT_TRUE(format.ok() && format->has_value()) << spec;
  constexpr int64_t N = 70, K = 96, M = 6;
  const int top = (1 << (*format)->bits) - 1;
  QuantizedMatrix qm(N, K, **format);
  const int64_t groups = qm.groups();
  for (int64_t n = 0; n < N; ++n) {
    std::vector<uint8_t> codes(K);
    for (int64_t k = 0; k < K; ++k) {
      // Rows of all-top, all-zero, and mixed codes.
      codes[k] = static_cast<uint8_t>(n % 3 == 0   ? top
                                      : n % 3 == 1 ? 0
                                                   : ((k / 4 + n) % 2) * top);
    }
    std::vector<float> scales(groups, 1.0f / 64);
    std::vector<uint8_t> zeros(groups, static_cast<uint8_t>(n % 2 ? 0 : top));
    qm.SetCodes(n, codes.data(), scales.data(), zeros.data());
  }
  // Row 0: +127 everywhere (low nibbles 15, high 7); row 1: -127 (high
  // nibbles -8); row 2: alternating signs; row 3: activations that
  // quantize to -1 (nibbles 15 and -1) beside one 127; rows 4-5: mixes.
  std::vector<float> x(M * K);
  for (int64_t k = 0; k < K; ++k) {
    x[0 * K + k] = 1.0f;
    x[1 * K + k] = -1.0f;
    x[2 * K + k] = k % 2 ? 1.0f : -1.0f;
    x[3 * K + k] = k % 32 == 0 ? 127.0f : -1.0f;
    x[4 * K + k] = (k / 2) % 2 ? 1.0f : -1.0f;
    x[5 * K + k] = k % 32 == 5 ? -127.0f : 15.0f;
  }
  ThreadPool pool(2);
  const std::vector<float> ref = QuantReference(qm, x, M);
  for (int64_t rows = 1; rows <= M; ++rows) {
    for (int64_t m0 = 0; m0 + rows <= M; ++m0) {
      std::vector<float> y(rows * N);
      QuantMatMul(pool, x.data() + m0 * K, rows, K, qm, nullptr, y.data(), N);
      ASSERT_EQ(std::memcmp(y.data(), ref.data() + m0 * N, y.size() * 4), 0)
          << spec << " rows " << m0 << "+" << rows;
    }
  }
}

TEST_P(QuantKernelTest, ExtremeIntegerSumsAreExact) {
  CheckExtremeQuantSums("int8");
  CheckExtremeQuantSums("int8-asym");
  CheckExtremeQuantSums("int8-g32");
  CheckExtremeQuantSums("int8-g64");
  CheckExtremeQuantSums("int4");
  CheckExtremeQuantSums("int4-asym");
  CheckExtremeQuantSums("int4-g32");
}

INSTANTIATE_TEST_SUITE_P(Kernels, QuantKernelTest,
                         ::testing::Values(QuantKernel::kScalar,
                                           QuantKernel::kVnni,
                                           QuantKernel::kAmx,
                                           QuantKernel::kAvx2),
                         [](const ::testing::TestParamInfo<QuantKernel>& info) {
                           switch (info.param) {
                             case QuantKernel::kScalar:
                               return std::string("Scalar");
                             case QuantKernel::kVnni:
                               return std::string("Vnni");
                             case QuantKernel::kAmx:
                               return std::string("Amx");
                             case QuantKernel::kAvx2:
                               return std::string("Avx2");
                             default:
                               return std::string("Auto");
                           }
                         });

// The default choice mixes kernels by row count (AMX from 16 rows where the
// CPU has it): every subset of rows still gets the same bits.
TEST(QuantMatMul, AutoKernelChoiceIsRowInvariant) {
  CheckQuantMatMul("int8", 130, 200, 45);
  CheckQuantMatMul("int4-g128-asym", 70, 256, 45);
}

TEST(QuantMatMul, SetCodesRoundTrips) {
  QuantFormat f{4, 32, false};
  QuantizedMatrix qm(3, 70, f);
  std::vector<uint8_t> codes(70);
  for (int k = 0; k < 70; ++k) codes[k] = static_cast<uint8_t>((k * 7) % 16);
  const float scales[3] = {0.5f, -0.25f, 1.0f / 1024};
  const uint8_t zeros[3] = {3, 15, 0};
  qm.SetCodes(1, codes.data(), scales, zeros);
  for (int k = 0; k < 70; ++k) {
    EXPECT_EQ(qm.Code(1, k), codes[k]);
    EXPECT_EQ(qm.Code(0, k), 0);
  }
  for (int g = 0; g < 3; ++g) {
    EXPECT_EQ(qm.Scale(1, g), scales[g]);
    EXPECT_EQ(qm.Zero(1, g), zeros[g]);
  }
}

}  // namespace
}  // namespace pdserve
