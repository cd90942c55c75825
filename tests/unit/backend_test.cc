// CPU backend: the packed matmul against a double-precision product, its
// row invariance (a row's result is bit-identical alone or among any other
// rows, with any thread count), and the thread pool's static split.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/backend/cpu/packed_matrix.h"
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
      double ref = bias[n];
      for (int64_t k = 0; k < K; ++k)
        ref += static_cast<double>(x[m * K + k]) * row[k];
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

TEST(MatMul, F32MatchesReferenceAndIsRowInvariant) {
  CheckMatMul(DType::kF32, 100, 37);
  CheckMatMul(DType::kF32, 64, 300);
  CheckMatMul(DType::kF32, 1, 5);
}

TEST(MatMul, Bf16MatchesReferenceAndIsRowInvariant) {
  CheckMatMul(DType::kBF16, 100, 37);
  CheckMatMul(DType::kBF16, 130, 513);
}

}  // namespace
}  // namespace pdserve
