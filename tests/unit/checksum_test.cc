// Xxh3 (common/util/checksum.h) against libxxhash's XXH3_64bits: every
// length class of the algorithm (0, 1-3, 4-8, 9-16, 17-128, 129-240, long
// inputs with partial stripes and blocks), unaligned starts, and a KV-chunk
// sized buffer, through the dispatcher and through the AVX2 code directly.
#include "common/util/checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/util/streaming_copy.h"
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

// Pieces of every split an import or export makes (rows, blocks, odd
// sizes, empty pieces) hash to Xxh3 of the whole, through both
// implementations' incremental functions.
TEST(Xxh3Stream, PiecesHashLikeTheWhole) {
  const std::string data = RandomBytes((size_t{4} << 20) + 64, 17);
  std::mt19937_64 rng(5);
  for (size_t n : Lengths()) {
    for (size_t max_piece : {size_t{1}, size_t{7}, size_t{256}, size_t{3072},
                             size_t{49152}, n + 1}) {
      if (max_piece < 64 && n > 4096) continue;  // slow, nothing new
      Xxh3Stream stream;
      std::vector<std::pair<size_t, size_t>> pieces;
      for (size_t at = 0; at < n;) {
        const size_t len = std::min(n - at, 1 + rng() % max_piece);
        pieces.emplace_back(at, len);
        at += len;
      }
      for (auto [at, len] : pieces) {
        stream.Update(data.data() + 3 + at, len);
        stream.Update(data.data(), 0);
      }
      ASSERT_EQ(stream.Digest(), XXH3_64bits(data.data() + 3, n))
          << n << " in pieces of <= " << max_piece;
    }
  }
  for (const checksum_internal::Xxh3StreamFns* fns :
       {&checksum_internal::kXxh3StreamBaseline,
        checksum_internal::kXxh3StreamAvx2}) {
    if (fns == nullptr) continue;
    alignas(64) unsigned char state[Xxh3Stream::kStateBytes];
    fns->reset(state);
    fns->update(state, data.data(), 1000);
    fns->update(state, data.data() + 1000, data.size() - 1000);
    EXPECT_EQ(fns->digest(state), XXH3_64bits(data.data(), data.size()));
  }
}

TEST(Xxh3Stream, CopyWithXxh3CopiesAndHashes) {
  const std::string data = RandomBytes((size_t{4} << 20) + 64, 19);
  for (size_t n : Lengths()) {
    std::string out(n + 2, 'x');
    ASSERT_EQ(CopyWithXxh3(out.data() + 1, data.data() + 1, n),
              XXH3_64bits(data.data() + 1, n))
        << n;
    ASSERT_EQ(out.substr(1, n), data.substr(1, n)) << n;
    ASSERT_EQ(out.front(), 'x');
    ASSERT_EQ(out.back(), 'x');
  }
}

// Non-temporal stores: the same bytes and hash as ordinary ones, for every
// length class and every misalignment of the destination (the unaligned
// head and tail take ordinary stores).
TEST(Xxh3Stream, CopyWithXxh3StreamingCopiesAndHashes) {
  const std::string data = RandomBytes((size_t{4} << 20) + 64, 23);
  for (size_t n : Lengths()) {
    for (size_t skew : {size_t{0}, size_t{1}, size_t{31}, size_t{32}}) {
      std::string out(n + 66, 'x');
      ASSERT_EQ(CopyWithXxh3(out.data() + skew, data.data() + 3, n,
                             Stores::kStreaming),
                XXH3_64bits(data.data() + 3, n))
          << n << " skew " << skew;
      ASSERT_EQ(out.substr(skew, n), data.substr(3, n)) << n;
      ASSERT_EQ(out.find_first_not_of('x', skew + n), std::string::npos);
      ASSERT_EQ(out.substr(0, skew), std::string(skew, 'x'));
    }
  }
}

TEST(StreamingCopy, CopiesEveryByteAndNothingElse) {
  const std::string data = RandomBytes(size_t{1} << 20, 29);
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{127}, size_t{128},
                   size_t{129}, size_t{4096} + 5, size_t{1} << 19}) {
    for (size_t skew = 0; skew < 64; skew += 7) {
      std::string out(n + 128, 'y');
      StreamingCopy(out.data() + skew, data.data() + 5, n);
      ASSERT_EQ(out.substr(skew, n), data.substr(5, n)) << n << " " << skew;
      ASSERT_EQ(out.substr(0, skew), std::string(skew, 'y'));
      ASSERT_EQ(out.find_first_not_of('y', skew + n), std::string::npos);
    }
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
