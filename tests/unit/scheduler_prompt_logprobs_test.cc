// GenerationScheduler's prompt logprobs: a prompt's scores are bit for bit
// the logprobs of generating those tokens, however it is chunked and with
// the prefix cache on; max_tokens 0 scores the prompt alone, up to the whole
// context; bad values are refused. After every test, 0 KV blocks are in use.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine.h"
#include "common/engine/scheduler.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_util.h"
#include "tests/unit/scheduler_test_util.h"

namespace pdserve::scheduler_test {
namespace {

using testing_util::LoadReferences;

// Every event of one request run alone.
std::vector<TokenEvent> Events(Engine& e, const SchedulerOptions& so,
                               const GenerationRequest& req,
                               SchedulerStats* stats = nullptr) {
  std::vector<TokenEvent> events;
  absl::Mutex mu;
  {
    GenerationScheduler s(&e, so);
    auto id = s.Submit(req, [&](const TokenEvent& ev) {
      absl::MutexLock lock(&mu);
      events.push_back(ev);
    });
    EXPECT_TRUE(id.ok()) << id.status();
    s.WaitIdle();
    if (stats != nullptr) *stats = s.stats();
  }
  return events;
}

// A prompt scored token by token (prompt_logprobs) gives, for each token,
// exactly the logprob and alternatives the model gave it when it generated
// that token: the prompt is the earlier prompt plus that generation. Same
// bits however the prompt is chunked (whole, 1, 7, 16 tokens per pass;
// 300+ tokens, more than one pass of kPromptLogprobsChunkTokens), and
// with the prefix cache on, which a scoring request does not use.
TEST(PromptLogprobs, ScoresAreTheLogprobsOfGeneratingThoseTokens) {
  auto e = MakeEngine({});
  constexpr int kTop = 4, kGen = 40;
  for (const int prompt_len : {37, 300}) {
    SCOPED_TRACE(absl::StrCat("prompt ", prompt_len));
    GenerationRequest gen =
        Seeded(RandomTokens(20 + prompt_len, prompt_len), 21, kGen);
    gen.sampling.top_logprobs = kTop;
    const std::vector<TokenEvent> generated = Events(*e, {}, gen);
    ASSERT_EQ(generated.size(), static_cast<size_t>(kGen));
    GenerationRequest score;
    score.prompt_ids = gen.prompt_ids;
    for (const TokenEvent& ev : generated) {
      score.prompt_ids.push_back(ev.token_id);
    }
    score.stop.max_tokens = 1;
    score.prompt_logprobs = kTop;
    for (const int chunk : {0, 1, 7, 16, 0}) {  // 0 twice: cached prefix
      SCOPED_TRACE(absl::StrCat("chunk ", chunk));
      SchedulerOptions so;
      so.prefill_chunk_tokens = chunk;
      SchedulerStats stats;
      const std::vector<TokenEvent> events = Events(*e, so, score, &stats);
      ASSERT_FALSE(events.empty());
      EXPECT_EQ(stats.prefix_hit_tokens, 0);
      EXPECT_EQ(stats.prefill_tokens_computed,
                static_cast<int64_t>(score.prompt_ids.size()));
      const std::vector<SampledToken>& scores = events[0].prompt_logprobs;
      ASSERT_EQ(scores.size(), score.prompt_ids.size() - 1);
      for (size_t t = 0; t < scores.size(); ++t) {
        ASSERT_EQ(scores[t].id, score.prompt_ids[t + 1]) << t;
        ASSERT_TRUE(std::isfinite(scores[t].logprob)) << t;
        ASSERT_LE(scores[t].logprob, 0.0f) << t;
        ASSERT_EQ(scores[t].top_logprobs.size(), static_cast<size_t>(kTop));
      }
      for (int i = 0; i < kGen; ++i) {
        const SampledToken& s = scores[prompt_len - 1 + i];
        EXPECT_EQ(s.id, generated[i].token_id) << i;
        EXPECT_EQ(s.logprob, generated[i].logprob) << i;
        EXPECT_EQ(s.top_logprobs, generated[i].top_logprobs) << i;
      }
      for (size_t k = 1; k < events.size(); ++k) {
        EXPECT_TRUE(events[k].prompt_logprobs.empty());
      }
    }
  }
  EXPECT_EQ(e->used_blocks(), 0);
}

// max_tokens 0 with prompt_logprobs: the prompt alone, which may fill the
// whole context. One final event ("length", no token) carries the scores,
// equal to those of the same tokens in a request that generates; chunked
// or not. Without prompt_logprobs, or past the context, it is refused.
TEST(PromptLogprobs, PromptOnlyRequestScoresTheWholeContextAndStops) {
  auto e = MakeEngine({});
  const int context = e->config().max_position_embeddings;
  GenerationRequest whole;
  whole.prompt_ids = RandomTokens(77, context);
  whole.stop.max_tokens = 0;
  whole.prompt_logprobs = 2;
  GenerationRequest generating = whole;  // one token shorter, + 1 generated
  generating.prompt_ids.pop_back();
  generating.stop.max_tokens = 1;
  const std::vector<TokenEvent> reference = Events(*e, {}, generating);
  ASSERT_FALSE(reference.empty());
  const std::vector<SampledToken>& want = reference[0].prompt_logprobs;
  ASSERT_EQ(want.size(), static_cast<size_t>(context - 2));
  for (const int chunk : {0, 7}) {
    SCOPED_TRACE(absl::StrCat("chunk ", chunk));
    SchedulerOptions so;
    so.prefill_chunk_tokens = chunk;
    const std::vector<TokenEvent> events = Events(*e, so, whole);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_TRUE(events[0].finished);
    EXPECT_FALSE(events[0].has_token);
    EXPECT_EQ(events[0].finish_reason, "length");
    const std::vector<SampledToken>& got = events[0].prompt_logprobs;
    ASSERT_EQ(got.size(), static_cast<size_t>(context - 1));
    for (size_t t = 0; t < want.size(); ++t) {
      EXPECT_EQ(got[t].id, want[t].id) << t;
      EXPECT_EQ(got[t].logprob, want[t].logprob) << t;
      EXPECT_EQ(got[t].rank, want[t].rank) << t;
      EXPECT_EQ(got[t].top_logprobs, want[t].top_logprobs) << t;
    }
    EXPECT_EQ(got.back().id, whole.prompt_ids.back());
  }
  EXPECT_EQ(e->used_blocks(), 0);
  GenerationScheduler s(e.get(), {});
  GenerationRequest unscored = whole;
  unscored.prompt_logprobs = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(
      s.Submit(unscored, [](const TokenEvent&) {}).status()));
  GenerationRequest too_long = whole;
  too_long.prompt_ids.push_back(1);
  EXPECT_TRUE(absl::IsInvalidArgument(
      s.Submit(too_long, [](const TokenEvent&) {}).status()));
}

TEST(PromptLogprobs, OutOfRangeIsRefused) {
  auto e = MakeEngine({});
  GenerationScheduler s(e.get(), {});
  GenerationRequest r = Greedy(LoadReferences()[0]);
  r.prompt_logprobs = 101;
  auto id = s.Submit(r, [](const TokenEvent&) {});
  EXPECT_TRUE(absl::IsInvalidArgument(id.status())) << id.status();
}

}  // namespace
}  // namespace pdserve::scheduler_test
