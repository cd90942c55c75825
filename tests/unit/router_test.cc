// Unit tests of the router's pure parts: stop strings over streamed text and
// request resolution (defaults with explicit presence, validation).
#include "gtest/gtest.h"
#include "router/request_builder.h"
#include "router/stop_matcher.h"

namespace pdserve {
namespace {

TEST(StopStringMatcherTest, HoldsBackPossiblePrefixesAndTrimsTheStop) {
  StopStringMatcher m({"The end", "!!"});
  EXPECT_EQ(m.Add("Once upon"), "Once upon");
  EXPECT_EQ(m.Add(" a time. The"), " a time. ");  // "The" may start "The end"
  EXPECT_EQ(m.Add(" cat"), "The cat");            // it did not
  EXPECT_EQ(m.Add(" said !"), " said ");          // "!" may start "!!"
  EXPECT_EQ(m.Add("!ignored"), "");               // stop: "!!" trimmed
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Add("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringMatcherTest, StopSpanningManyDeltasAndFlush) {
  StopStringMatcher m({"<end>"});
  std::string out;
  for (const char* d : {"ab", "<", "e", "n", "d", ">", "zz"}) out += m.Add(d);
  EXPECT_EQ(out, "ab");
  EXPECT_TRUE(m.stopped());
  StopStringMatcher n({"xyz"});
  EXPECT_EQ(n.Add("abcx"), "abc");
  EXPECT_EQ(n.Flush(), "x");  // the stream ended: release what was held
  StopStringMatcher none({});
  EXPECT_EQ(none.Add("anything"), "anything");
}

RouterModelInfo Model() {
  RouterModelInfo m;
  m.vocab_size = 512;
  m.max_context = 512;
  m.eos_ids = {2};
  return m;
}

TEST(ResolveRequestTest, UnsetFieldsTakeDefaultsAndZeroIsNotUnset) {
  pdserve::v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(1);
  auto unset =
      ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits());
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(unset->sampling.temperature, 1.0f);
  EXPECT_EQ(unset->sampling.top_p, 1.0f);
  EXPECT_EQ(unset->stop.max_tokens, 256);
  r.mutable_sampling()->set_temperature(0.0f);
  r.set_max_tokens(7);
  auto set =
      ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits());
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->sampling.temperature, 0.0f);
  EXPECT_EQ(set->stop.max_tokens, 7);
  // The default max_tokens shrinks to the context left.
  for (int i = 0; i < 400; ++i) r.mutable_token_ids()->add_ids(5);
  r.clear_max_tokens();
  auto near_full =
      ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits());
  ASSERT_TRUE(near_full.ok());
  EXPECT_EQ(near_full->stop.max_tokens, 512 - 401);
}

TEST(ResolveRequestTest, TextWithoutTokenizerAndBadValues) {
  pdserve::v1::GenerateRequest r;
  r.set_text("hello");
  EXPECT_TRUE(absl::IsFailedPrecondition(
      ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits())
          .status()));
  r.mutable_token_ids()->add_ids(1);
  r.mutable_sampling()->set_top_k(-2);
  auto bad =
      ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("top_k"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
