// Xxh3 (common/util/checksum.h) against libxxhash's XXH3_64bits: every
// length class of the algorithm (0, 1-3, 4-8, 9-16, 17-128, 129-240, long
// inputs with partial stripes and blocks), unaligned starts, and a KV-chunk
// sized buffer, through the dispatcher and through the AVX2 code directly.
#include "common/util/checksum.h"

#include <xxhash.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rng());
  return s;
}

std::vector<size_t> Lengths() {
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (size_t n : {1023, 1024, 1025, 4095, 4096, 4097, 65536 + 17, 1 << 20}) {
    lengths.push_back(n);
  }
  lengths.push_back((size_t{4} << 20) + 3);  // a KV chunk and a bit
  return lengths;
}

TEST(Xxh3, EqualsLibxxhashForEveryLengthClass) {
  const std::string data = RandomBytes((size_t{4} << 20) + 64, 7);
  for (size_t n : Lengths()) {
    for (size_t offset : {0, 1, 13}) {
      const char* p = data.data() + offset;
      ASSERT_EQ(Xxh3(p, n), XXH3_64bits(p, n)) << n << " at +" << offset;
    }
  }
  EXPECT_EQ(Xxh3("", 0), 0x2D06800538D394C2ull);
}

TEST(Xxh3, Avx2CodeEqualsBaseline) {
  if (checksum_internal::kXxh3Avx2 == nullptr ||
      !__builtin_cpu_supports("avx2")) {
    GTEST_SKIP() << "no AVX2 here: Xxh3 is libxxhash's baseline code";
  }
  EXPECT_STREQ(Xxh3Implementation(), "avx2");
  const std::string data = RandomBytes((size_t{4} << 20) + 64, 11);
  for (size_t n : Lengths()) {
    ASSERT_EQ(checksum_internal::kXxh3Avx2(data.data() + 5, n),
              checksum_internal::Xxh3Baseline(data.data() + 5, n))
        << n;
  }
}

TEST(Xxh3, ChangesWithAnyFlippedByte) {
  std::string data = RandomBytes(size_t{1} << 20, 3);
  const uint64_t before = Xxh3(data.data(), data.size());
  for (size_t at :
       {size_t{0}, size_t{4095}, data.size() / 2, data.size() - 1}) {
    data[at] ^= 0x5a;
    EXPECT_NE(Xxh3(data.data(), data.size()), before) << at;
    data[at] ^= 0x5a;
  }
  EXPECT_EQ(Xxh3(data.data(), data.size()), before);
}

}  // namespace
}  // namespace pdserve
