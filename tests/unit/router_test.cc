// Unit tests of the router's pure parts: stop strings over streamed text and
// request resolution (defaults with explicit presence, validation).
#include <cmath>
#include <functional>

#include "gtest/gtest.h"
#include "router/http/openai_response.h"
#include "router/request_builder.h"
#include "router/router_options.h"
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

// include_stop (vLLM's include_stop_str_in_output) keeps the stop string
// that ended the text, the earliest one; of two at the same place, the
// first listed.
TEST(StopStringMatcherTest, IncludeStopKeepsTheStopString) {
  StopStringMatcher m({"end", "!!"}, /*include_stop=*/true);
  EXPECT_EQ(m.Add("the e"), "the ");
  EXPECT_EQ(m.Add("nd!! more"), "end");
  EXPECT_TRUE(m.stopped());
  StopStringMatcher earliest({"cd", "b"}, /*include_stop=*/true);
  EXPECT_EQ(earliest.Add("abcd"), "ab");
  StopStringMatcher same_place({"ab", "abc"}, /*include_stop=*/true);
  EXPECT_EQ(same_place.Add("xabcz"), "xab");
  StopStringMatcher trimmed({"ab", "abc"});
  EXPECT_EQ(trimmed.Add("xabcz"), "x");
}

// Short of min_tokens (may_stop false) no stop string ends the text; one
// that completes afterwards does, even if it began before.
TEST(StopStringMatcherTest, NoStopBeforeMinTokens) {
  StopStringMatcher m({"ab"});
  EXPECT_EQ(m.Add("xab", /*may_stop=*/false), "xab");
  EXPECT_EQ(m.Add("ya", /*may_stop=*/false), "y");  // "a" may start "ab"
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.Add("bz", /*may_stop=*/true), "");
  EXPECT_TRUE(m.stopped());
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
  // max_tokens 0 with prompt_logprobs: the prompt alone, up to the whole
  // context.
  r.clear_token_ids();
  for (int i = 0; i < 512; ++i) r.mutable_token_ids()->add_ids(5);
  r.set_max_tokens(0);
  r.set_prompt_logprobs(0);
  auto prompt_only =
      ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits());
  ASSERT_TRUE(prompt_only.ok()) << prompt_only.status();
  EXPECT_EQ(prompt_only->stop.max_tokens, 0);
  r.mutable_token_ids()->add_ids(5);
  EXPECT_TRUE(absl::IsInvalidArgument(
      ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits())
          .status()));
}

// Past the context, the refusal is context_length_exceeded (what clients
// act on) even when max_tokens is also above the router's cap; within the
// context, the cap is what refuses it.
TEST(ResolveRequestTest, TheContextIsSaidBeforeTheCap) {
  pdserve::v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(1);
  RequestLimits limits;
  limits.max_tokens_cap = 100;
  limits.default_max_tokens = 100;
  r.set_max_tokens(2147483647);
  const absl::Status past_both =
      ResolveRequest(r, nullptr, ChatSupport(), Model(), limits).status();
  EXPECT_TRUE(absl::IsInvalidArgument(past_both)) << past_both;
  EXPECT_EQ(InvalidReason(past_both), "context_length_exceeded") << past_both;
  EXPECT_NE(past_both.message().find("you requested 2147483648 tokens (1 in "
                                     "the prompt, 2147483647 in the "
                                     "completion)"),
            std::string::npos)
      << past_both;
  r.set_max_tokens(200);
  const absl::Status past_cap =
      ResolveRequest(r, nullptr, ChatSupport(), Model(), limits).status();
  EXPECT_TRUE(absl::IsInvalidArgument(past_cap)) << past_cap;
  EXPECT_EQ(InvalidReason(past_cap), "") << past_cap;
  EXPECT_NE(past_cap.message().find("above the limit of 100"),
            std::string::npos)
      << past_cap;
  r.set_max_tokens(100);
  EXPECT_TRUE(ResolveRequest(r, nullptr, ChatSupport(), Model(), limits).ok());
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

// Presence and frequency penalties take OpenAI's range, [-2, 2], edges
// included; beyond (or NaN) is INVALID_ARGUMENT naming the field.
TEST(ResolveRequestTest, PenaltiesTakeOpenAisRange) {
  const auto resolve = [](float presence, float frequency) {
    pdserve::v1::GenerateRequest r;
    r.mutable_token_ids()->add_ids(1);
    r.mutable_sampling()->set_presence_penalty(presence);
    r.mutable_sampling()->set_frequency_penalty(frequency);
    return ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits())
        .status();
  };
  EXPECT_TRUE(resolve(-2.0f, 2.0f).ok());
  EXPECT_TRUE(resolve(2.0f, -2.0f).ok());
  EXPECT_TRUE(resolve(0.5f, 1.5f).ok());
  for (float bad : {2.5f, -3.0f, std::nanf(""), 1e30f}) {
    const absl::Status p = resolve(bad, 0.0f);
    EXPECT_TRUE(absl::IsInvalidArgument(p)) << bad << ": " << p;
    EXPECT_NE(p.message().find("presence_penalty must be in [-2, 2]"),
              std::string::npos)
        << p;
    const absl::Status f = resolve(0.0f, bad);
    EXPECT_TRUE(absl::IsInvalidArgument(f)) << bad << ": " << f;
    EXPECT_NE(f.message().find("frequency_penalty must be in [-2, 2]"),
              std::string::npos)
        << f;
    EXPECT_EQ(InvalidField(p), "presence_penalty");
    EXPECT_EQ(InvalidField(f), "frequency_penalty");
  }
}

// logit_bias reaches the workers sorted by id (one order whatever the
// proto map's), each value as given; more entries than the limit are
// refused.
TEST(ResolveRequestTest, LogitBiasIsSortedAndBounded) {
  pdserve::v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(1);
  auto& bias = *r.mutable_sampling()->mutable_logit_bias();
  for (int id : {9, 3, 200, 0}) bias[id] = static_cast<float>(id) - 100.0f;
  auto ok = ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits());
  ASSERT_TRUE(ok.ok()) << ok.status();
  const std::vector<std::pair<int32_t, float>> want = {
      {0, -100.0f}, {3, -97.0f}, {9, -91.0f}, {200, 100.0f}};
  EXPECT_EQ(ok->sampling.logit_bias, want);
  RequestLimits limits;
  limits.max_logit_bias = 3;
  auto over = ResolveRequest(r, nullptr, ChatSupport(), Model(), limits);
  EXPECT_TRUE(absl::IsInvalidArgument(over.status())) << over.status();
  EXPECT_NE(over.status().message().find("more than the limit of 3"),
            std::string::npos);
}

// Each validation error names its field (the HTTP API's error "param"), by
// its generate.proto name; the HTTP API maps a few to OpenAI's names.
TEST(ResolveRequestTest, ValidationErrorsNameTheirField) {
  const auto field_of =
      [](const std::function<void(pdserve::v1::GenerateRequest&)>& set) {
        pdserve::v1::GenerateRequest r;
        r.mutable_token_ids()->add_ids(1);
        set(r);
        const absl::Status s =
            ResolveRequest(r, nullptr, ChatSupport(), Model(), RequestLimits())
                .status();
        EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
        return InvalidField(s);
      };
  using Req = pdserve::v1::GenerateRequest;
  EXPECT_EQ(field_of([](Req& r) { r.mutable_sampling()->set_temperature(-1); }),
            "temperature");
  EXPECT_EQ(field_of([](Req& r) { r.mutable_sampling()->set_top_p(0); }),
            "top_p");
  EXPECT_EQ(field_of([](Req& r) { r.set_max_tokens(0); }), "max_tokens");
  EXPECT_EQ(field_of([](Req& r) { r.set_max_tokens(-1); }), "max_tokens");
  EXPECT_EQ(field_of([](Req& r) {
              r.set_max_tokens(-1);
              r.set_prompt_logprobs(0);
            }),
            "max_tokens");
  EXPECT_EQ(field_of([](Req& r) {
              r.set_max_tokens(0);
              r.set_prompt_logprobs(0);
              r.set_min_tokens(1);
            }),
            "min_tokens");
  EXPECT_EQ(field_of([](Req& r) { r.set_max_tokens(600); }), "max_tokens");
  EXPECT_EQ(field_of([](Req& r) { r.mutable_token_ids()->add_ids(-4); }),
            "prompt");
  EXPECT_EQ(field_of([](Req& r) { r.add_stop(""); }), "stop");
  EXPECT_EQ(field_of([](Req& r) { r.add_stop_token_ids(1 << 20); }),
            "stop_token_ids");
  EXPECT_EQ(field_of([](Req& r) { r.set_top_logprobs(99); }), "top_logprobs");
  EXPECT_EQ(field_of([](Req& r) {
              r.set_max_tokens(4);
              r.set_min_tokens(5);
            }),
            "min_tokens");
  EXPECT_EQ(field_of([](Req& r) { r.set_min_tokens(-1); }), "min_tokens");
  EXPECT_EQ(field_of([](Req& r) {
              (*r.mutable_sampling()->mutable_logit_bias())[1 << 20] = 1;
            }),
            "logit_bias");
  EXPECT_EQ(field_of([](Req& r) {
              (*r.mutable_sampling()->mutable_logit_bias())[5] = 100.5f;
            }),
            "logit_bias");
  EXPECT_EQ(field_of([](Req& r) { r.set_prompt_logprobs(-1); }),
            "prompt_logprobs");
  EXPECT_EQ(field_of([](Req& r) { r.set_prompt_logprobs(101); }),
            "prompt_logprobs");
  EXPECT_EQ(InvalidField(absl::InvalidArgumentError("other")), "");
  EXPECT_EQ(InvalidField(absl::OkStatus()), "");

  absl::Status prompt = absl::InvalidArgumentError("x");
  prompt.SetPayload("type.pdserve/invalid_field", absl::Cord("prompt"));
  ASSERT_EQ(InvalidField(prompt), "prompt");
  EXPECT_EQ(openai::OpenAiParamOf(prompt, /*chat=*/true), "messages");
  EXPECT_EQ(openai::OpenAiParamOf(prompt, /*chat=*/false), "prompt");
  absl::Status top = absl::InvalidArgumentError("x");
  top.SetPayload("type.pdserve/invalid_field", absl::Cord("top_logprobs"));
  EXPECT_EQ(openai::OpenAiParamOf(top, /*chat=*/true), "top_logprobs");
  EXPECT_EQ(openai::OpenAiParamOf(top, /*chat=*/false), "logprobs");
}

// Router settings out of range are refused with the flag's name (they were
// clamped or taken as given: --max_attempts=0 failed every request).
TEST(RouterOptionsTest, OutOfRangeSettingsNameTheirFlag) {
  EXPECT_TRUE(CheckRouterOptions(RouterOptions()).ok());
  auto refusal = [](auto change) {
    RouterOptions o;
    change(o);
    return std::string(CheckRouterOptions(o).message());
  };
  EXPECT_EQ(refusal([](RouterOptions& o) { o.max_attempts = 0; }),
            "--max_attempts must be >= 1");
  EXPECT_EQ(
      refusal([](RouterOptions& o) { o.limits.default_max_tokens = 5000; }),
      "--default_max_tokens must be in [1, --max_tokens_cap]");
  EXPECT_EQ(refusal([](RouterOptions& o) {
              o.admission_timeout = absl::Seconds(-1);
            }),
            "--admission_timeout must be >= 0");
  EXPECT_EQ(refusal([](RouterOptions& o) { o.admission_queue = -1; }),
            "--admission_queue must be >= 0");
  // The edges that mean something stay allowed.
  EXPECT_EQ(refusal([](RouterOptions& o) {
              o.max_in_flight = 0;
              o.admission_queue = 0;
              o.max_migrations = 0;
              o.worker_wait = absl::ZeroDuration();
              o.prefix_routing_blocks = 0;
            }),
            "");
}

}  // namespace
}  // namespace pdserve
