// The router's prefix affinity key: prompts sharing their first full blocks
// share a key; a prompt without a reusable full block (one token is always
// computed) has none.
#include <vector>

#include "gtest/gtest.h"
#include "router/worker_pool.h"

namespace pdserve {
namespace {

std::vector<int32_t> Range(int n, int start) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

TEST(PrefixAffinityKey, SharedLeadingBlocksShareTheKey) {
  std::vector<int32_t> a = Range(64, 1), b = Range(64, 1);
  a.push_back(500);
  b.push_back(7);
  b.push_back(8);
  ASSERT_TRUE(PrefixAffinityKey(a, 16, 2).has_value());
  EXPECT_EQ(PrefixAffinityKey(a, 16, 2), PrefixAffinityKey(b, 16, 2));
  // Differences after the keyed blocks do not matter; inside them they do.
  std::vector<int32_t> c = b;
  c[40] = 0;
  EXPECT_EQ(PrefixAffinityKey(c, 16, 2), PrefixAffinityKey(b, 16, 2));
  c[20] = 0;
  EXPECT_NE(PrefixAffinityKey(c, 16, 2), PrefixAffinityKey(b, 16, 2));
  // With fewer full blocks than asked, the available ones are keyed: 17
  // tokens leave one reusable block of 16.
  EXPECT_EQ(PrefixAffinityKey(Range(17, 1), 16, 2),
            PrefixAffinityKey(Range(30, 1), 16, 1));
}

TEST(PrefixAffinityKey, NoneWithoutAReusableBlockOrWhenOff) {
  EXPECT_FALSE(PrefixAffinityKey(Range(16, 1), 16, 2).has_value());
  EXPECT_FALSE(PrefixAffinityKey({}, 16, 2).has_value());
  EXPECT_FALSE(PrefixAffinityKey(Range(64, 1), 16, 0).has_value());
  EXPECT_FALSE(PrefixAffinityKey(Range(64, 1), 0, 2).has_value());
}

}  // namespace
}  // namespace pdserve
