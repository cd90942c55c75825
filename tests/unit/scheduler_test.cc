// GenerationScheduler at scale: chunked prefill (chunk sizes 1, 16, 100 and a
// small token budget per pass) gives the unchunked output; preemption under a
// deliberately tiny KV budget still yields every request's exact output
// (stories260K's reference greedy generations and concurrent seeded
// requests), pushed sequences included (their prompt's blocks taken at the
// push, never stuck behind a request short of blocks); the batch-size limit
// and the KV watermark bound admission; the
// old full-reservation mode waits instead of preempting; the prefix cache
// serves a second request sharing a 64-token prefix; a request resumed with
// its earlier outputs as prompt (marked as generated, as after a migration)
// continues exactly, with presence/frequency penalties (prompt logprobs:
// scheduler_prompt_logprobs_test.cc). After every test, 0
// KV blocks are in use (cached-but-unreferenced prefix blocks count as free).
#include "common/engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine_test_util.h"
#include "tests/unit/scheduler_test_util.h"

namespace pdserve {
namespace {

using scheduler_test::Greedy;
using scheduler_test::MakeEngine;
using scheduler_test::PoolOptions;
using scheduler_test::RandomTokens;
using scheduler_test::Seeded;
using testing_util::LoadReferences;
using testing_util::Reference;

struct Outcome {
  std::vector<int32_t> tokens;
  std::string reason;
  absl::Status status;
};

// Runs every request concurrently on one scheduler; outputs by index.
struct Batch {
  std::map<int, Outcome> out;
  SchedulerStats stats;
  int max_running_seen = 0;
};
Batch RunAll(Engine& e, const SchedulerOptions& so,
             const std::vector<GenerationRequest>& reqs) {
  Batch b;
  absl::Mutex mu;
  {
    GenerationScheduler s(&e, so);
    // Submitted while the loop is held, so that all wait together.
    s.WithEngine([&](Engine&) {
      for (size_t i = 0; i < reqs.size(); ++i) {
        auto id = s.Submit(reqs[i], [&, i](const TokenEvent& ev) {
          const int running = s.stats().running;
          absl::MutexLock lock(&mu);
          b.max_running_seen = std::max(b.max_running_seen, running);
          Outcome& o = b.out[i];
          if (ev.has_token) o.tokens.push_back(ev.token_id);
          if (ev.finished) {
            o.reason = ev.finish_reason;
            o.status = ev.status;
          }
        });
        EXPECT_TRUE(id.ok()) << id.status();
      }
    });
    s.WaitIdle();
    b.stats = s.stats();
  }
  return b;
}

// What each request generates alone on a roomy pool without prefix caching.
std::vector<std::vector<int32_t>> Alone(
    const std::vector<GenerationRequest>& reqs) {
  auto e = MakeEngine({.prefix_cache = false});
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : reqs) {
    out.push_back(RunAll(*e, {}, {r}).out[0].tokens);
  }
  EXPECT_EQ(e->used_blocks(), 0);
  return out;
}

std::vector<GenerationRequest> MixedRequests() {
  std::vector<GenerationRequest> reqs;
  for (const Reference& r : LoadReferences()) reqs.push_back(Greedy(r));
  reqs.push_back(Seeded(RandomTokens(1, 150), 11, 40));
  reqs.push_back(Seeded(RandomTokens(2, 37), 12, 60));
  reqs.push_back(Seeded(LoadReferences()[0].prompt_ids, 13, 50));
  reqs.push_back(Seeded(LoadReferences()[0].prompt_ids, 14, 50));
  return reqs;
}

TEST(ChunkedPrefill, ChunkSizesOneSixteenAndHundredMatchUnchunked) {
  const auto reqs = MixedRequests();
  const auto want = Alone(reqs);
  const auto refs = LoadReferences();
  for (size_t i = 0; i < refs.size(); ++i) {
    ASSERT_EQ(want[i], refs[i].output_ids) << "request " << i;
  }
  auto e = MakeEngine({.prefix_cache = false});
  for (int chunk : {0, 1, 16, 100}) {
    SchedulerOptions so;
    so.prefill_chunk_tokens = chunk;
    const Batch b = RunAll(*e, so, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(b.out.at(i).tokens, want[i]) << "chunk " << chunk << " #" << i;
    }
    EXPECT_EQ(b.stats.prefill_tokens_computed, 150 + 37 + 6 * 4 + 10);
    EXPECT_EQ(e->used_blocks(), 0);
  }
  // A small token budget per pass also splits prompts (and delays decodes).
  SchedulerOptions so;
  so.max_batch_tokens = 24;
  const Batch b = RunAll(*e, so, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(b.out.at(i).tokens, want[i]) << "budget 24 #" << i;
  }
  EXPECT_EQ(e->used_blocks(), 0);
}

void CheckPreemption(bool prefix_cache) {
  const auto reqs = MixedRequests();
  const auto want = Alone(reqs);
  // 32 blocks of 8 tokens: the longest request (150 + 40 tokens) fits
  // alone; all seven together would need about 84.
  auto e = MakeEngine({.kv_bytes = 32 * 8 * 256 * 5,
                       .block_size = 8,
                       .prefix_cache = prefix_cache});
  ASSERT_EQ(e->total_blocks(), 32);
  SchedulerOptions so;
  so.prefill_chunk_tokens = 16;
  so.kv_watermark = 0;
  const Batch b = RunAll(*e, so, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(b.out.at(i).status.ok()) << b.out.at(i).status;
    EXPECT_EQ(b.out.at(i).reason, "length") << "#" << i;
    EXPECT_EQ(b.out.at(i).tokens, want[i]) << "#" << i;
  }
  EXPECT_GT(b.stats.preemptions, 0);
  // Re-prefills recompute (or, with the cache, reattach) earlier tokens.
  EXPECT_GT(b.stats.prefill_tokens_computed + b.stats.prefix_hit_tokens,
            150 + 37 + 6 * 4 + 10);
  std::printf(
      "prefix cache %d: %lld preemptions, %lld prefill tokens, %lld "
      "reused\n",
      prefix_cache, static_cast<long long>(b.stats.preemptions),
      static_cast<long long>(b.stats.prefill_tokens_computed),
      static_cast<long long>(b.stats.prefix_hit_tokens));
  EXPECT_EQ(b.stats.running, 0);
  EXPECT_EQ(b.stats.waiting, 0);
  EXPECT_EQ(e->used_blocks(), 0);
  EXPECT_EQ(e->free_blocks(), e->total_blocks());
}

TEST(Preemption, TinyKvBudgetStillGivesExactOutputs) { CheckPreemption(false); }
TEST(Preemption, TinyKvBudgetWithPrefixCacheStillExact) {
  CheckPreemption(true);
}

TEST(Preemption, FullReservationModeWaitsInsteadOfPreempting) {
  const auto reqs = MixedRequests();
  const auto want = Alone(reqs);
  auto e = MakeEngine({.kv_bytes = 32 * 8 * 256 * 5, .block_size = 8});
  SchedulerOptions so;
  so.reserve_full_request = true;
  const Batch b = RunAll(*e, so, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(b.out.at(i).tokens, want[i]) << "#" << i;
  }
  EXPECT_EQ(b.stats.preemptions, 0);
  EXPECT_EQ(e->used_blocks(), 0);
}

TEST(Admission, MaxBatchSizeBoundsRunningSequences) {
  const auto reqs = MixedRequests();
  const auto want = Alone(reqs);
  auto e = MakeEngine({});
  SchedulerOptions so;
  so.max_num_seqs = 2;
  const Batch b = RunAll(*e, so, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(b.out.at(i).tokens, want[i]) << "#" << i;
  }
  EXPECT_EQ(b.max_running_seen, 2);
  EXPECT_EQ(e->used_blocks(), 0);
}

TEST(Admission, KvWatermarkHoldsNewSequencesBack) {
  // Two 100-token prompts (7 blocks each of 16) on a 20-block pool.
  std::vector<GenerationRequest> reqs = {Seeded(RandomTokens(3, 100), 1, 20),
                                         Seeded(RandomTokens(4, 100), 2, 20)};
  const auto want = Alone(reqs);
  auto e = MakeEngine({.kv_bytes = 20 * 16 * 256 * 5});
  ASSERT_EQ(e->total_blocks(), 20);
  SchedulerOptions so;
  so.kv_watermark = 0.5;  // 20 - 7 - 7 < 10: the second waits
  Batch held = RunAll(*e, so, reqs);
  EXPECT_EQ(held.max_running_seen, 1);
  so.kv_watermark = 0.2;  // 20 - 7 - 7 >= 4: both run
  Batch both = RunAll(*e, so, reqs);
  EXPECT_EQ(both.max_running_seen, 2);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(held.out.at(i).tokens, want[i]);
    EXPECT_EQ(both.out.at(i).tokens, want[i]);
  }
  EXPECT_EQ(e->used_blocks(), 0);
}

// The scheduler holds max_num_seqs + max_waiting requests, the capacity a
// decode worker reports, even while none has reached the batch yet.
TEST(Admission, BoundedQueueRejectsTheExcess) {
  const auto reqs = MixedRequests();
  const auto want = Alone(reqs);
  ASSERT_GT(reqs.size(), 3u);
  auto e = MakeEngine({});
  SchedulerOptions so;
  so.max_num_seqs = 2;
  so.max_waiting = 1;
  std::map<int, std::vector<int32_t>> out;
  absl::Mutex mu;
  std::vector<absl::StatusCode> codes;
  SchedulerStats stats;
  {
    GenerationScheduler s(e.get(), so);
    s.WithEngine([&](Engine&) {  // the loop cannot admit meanwhile
      for (size_t i = 0; i < reqs.size(); ++i) {
        auto id = s.Submit(reqs[i], [&, i](const TokenEvent& ev) {
          absl::MutexLock lock(&mu);
          if (ev.has_token) out[i].push_back(ev.token_id);
        });
        codes.push_back(id.status().code());
      }
    });
    s.WaitIdle();
    stats = s.stats();
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i < 3) {
      EXPECT_EQ(codes[i], absl::StatusCode::kOk);
      EXPECT_EQ(out[i], want[i]) << "#" << i;
    } else {
      EXPECT_EQ(codes[i], absl::StatusCode::kResourceExhausted) << "#" << i;
      EXPECT_EQ(out.count(i), 0u);
    }
  }
  EXPECT_EQ(stats.rejected, static_cast<int64_t>(reqs.size()) - 3);
  EXPECT_EQ(e->used_blocks(), 0);
}

// A sequence whose KV was pushed to the decode worker already holds its
// blocks: refusing it at max_waiting would throw away its prefill and
// transfer (the router would redo both). It is admitted past the bound and
// counts as held, so plain submissions stay refused.
TEST(Admission, ImportedSequencesAreNeverRefused) {
  const auto reqs = MixedRequests();
  const auto want = Alone(reqs);
  ASSERT_GT(reqs.size(), 3u);
  auto e = MakeEngine({});
  SchedulerOptions so;
  so.max_num_seqs = 1;
  so.max_waiting = 1;
  absl::Mutex mu;
  std::map<int, std::vector<int32_t>> out;
  const auto collect = [&](int i) {
    return [&, i](const TokenEvent& ev) {
      absl::MutexLock lock(&mu);
      if (ev.has_token) out[i].push_back(ev.token_id);
    };
  };
  std::vector<absl::StatusCode> codes;
  SchedulerStats stats;
  {
    GenerationScheduler s(e.get(), so);
    s.WithEngine([&](Engine& engine) {  // the loop cannot admit meanwhile
      for (int i = 0; i < 3; ++i) {
        codes.push_back(s.Submit(reqs[i], collect(i)).status().code());
      }
      // Request 3's prompt, prefilled here as a prefill worker would.
      const GenerationRequest& r = reqs[3];
      auto seq = engine.CreateSequence();
      ASSERT_TRUE(seq.ok()) << seq.status();
      std::vector<float> logits;
      ASSERT_TRUE(engine.Forward({{*seq, r.prompt_ids, true}}, &logits).ok());
      const SampledToken first =
          SampleToken(logits, r.sampling, r.prompt_ids, {},
                      static_cast<int64_t>(r.prompt_ids.size()));
      ASSERT_EQ(first.id, want[3][0]);
      codes.push_back(
          s.SubmitWithKv(r, *seq, first.id, collect(3)).status().code());
      codes.push_back(s.Submit(reqs[0], collect(4)).status().code());
    });
    s.WaitIdle();
    stats = s.stats();
  }
  EXPECT_EQ(codes,
            (std::vector<absl::StatusCode>{
                absl::StatusCode::kOk, absl::StatusCode::kOk,
                absl::StatusCode::kResourceExhausted, absl::StatusCode::kOk,
                absl::StatusCode::kResourceExhausted}));
  EXPECT_EQ(out[0], want[0]);
  EXPECT_EQ(out[1], want[1]);
  EXPECT_EQ(out[3], std::vector<int32_t>(want[3].begin() + 1, want[3].end()));
  EXPECT_EQ(out.count(2), 0u);
  EXPECT_EQ(out.count(4), 0u);
  EXPECT_EQ(stats.rejected, 2);
  EXPECT_EQ(e->used_blocks(), 0);
}

// The prompt's KV computed into `seq` as a prefill worker would, then
// submitted as a decode worker does with the first token sampled from the
// last logits, which it returns. Inside WithEngine (the loop held).
int32_t ComputeAndSubmit(GenerationScheduler& s, Engine& engine,
                         const GenerationRequest& r, SeqId seq,
                         const TokenCallback& callback) {
  std::vector<float> logits;
  EXPECT_TRUE(engine.Forward({{seq, r.prompt_ids, true}}, &logits).ok());
  const SampledToken first =
      SampleToken(logits, r.sampling, r.prompt_ids, {},
                  static_cast<int64_t>(r.prompt_ids.size()));
  EXPECT_TRUE(s.SubmitWithKv(r, seq, first.id, callback).ok());
  return first.id;
}

// Pushed sequences take their prompt's blocks and grow on demand like local
// ones: more of them than the pool holds at their full length run, are
// preempted and re-prefilled, and end exactly. A push is refused while a
// queued request waits for blocks (it would take them), and one waiting
// behind such a request, holding its blocks, is admitted past it (else,
// with nothing running, neither could ever run).
TEST(Preemption, ImportedSequencesGrowOnDemandAndNeverWaitBehindAShortOne) {
  const std::vector<GenerationRequest> reqs = {
      Seeded(RandomTokens(21, 20), 1, 60),
      Seeded(RandomTokens(22, 30), 2, 60),
      Seeded(RandomTokens(23, 12), 3, 60),
      Seeded(RandomTokens(24, 25), 4, 60),
      Seeded(RandomTokens(25, 100), 5, 30),
      Seeded(RandomTokens(26, 159), 6, 20)};
  const auto want = Alone(reqs);
  auto e = MakeEngine({.kv_bytes = 32 * 8 * 256 * 5, .block_size = 8});
  ASSERT_EQ(e->total_blocks(), 32);
  SchedulerOptions so;
  so.kv_watermark = 0;
  absl::Mutex mu;
  std::map<int, std::vector<int32_t>> out;  // with the first token in front
  std::map<int, absl::Notification> done;
  const auto collect = [&](int i) {
    return [&, i](const TokenEvent& ev) {
      absl::MutexLock lock(&mu);
      if (ev.has_token) out[i].push_back(ev.token_id);
      if (ev.finished) done[i].Notify();
    };
  };
  // False when request i never finished (the scheduler's destructor then
  // cancels what is left).
  const auto wait_for = [&](int i) {
    if (!done[i].WaitForNotificationWithTimeout(absl::Seconds(60))) {
      ADD_FAILURE() << "#" << i << " never finished";
      return false;
    }
    absl::MutexLock lock(&mu);
    EXPECT_EQ(out[i], want[i]) << "#" << i;
    return true;
  };
  // Every entry made now: the callbacks and wait_for only look them up.
  for (int i = 0; i < 6; ++i) done[i];
  GenerationScheduler s(e.get(), so);
  // 300 tokens could never fit 32 blocks of 8.
  EXPECT_EQ(s.CreateSequenceForImport(20, 280).status().code(),
            absl::StatusCode::kOutOfRange);
  // Four pushes take 2-4 blocks each and need 9-12 by their end; they
  // arrive together (the loop held).
  std::vector<SeqId> seqs;
  for (int i = 0; i < 4; ++i) {
    auto seq = s.CreateSequenceForImport(
        static_cast<int>(reqs[i].prompt_ids.size()), reqs[i].stop.max_tokens);
    ASSERT_TRUE(seq.ok()) << seq.status();
    seqs.push_back(*seq);
    absl::MutexLock lock(&mu);
    out[i].push_back(want[i][0]);
  }
  EXPECT_EQ(e->used_blocks(), 3 + 4 + 2 + 4) << "the prompts' blocks alone";
  s.WithEngine([&](Engine& engine) {
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(ComputeAndSubmit(s, engine, reqs[i], seqs[i], collect(i)),
                want[i][0]);
    }
  });
  for (int i = 0; i < 4; ++i) {
    if (!wait_for(i)) return;
  }
  s.WaitIdle();
  EXPECT_GT(s.stats().preemptions, 0);
  EXPECT_EQ(e->used_blocks(), 0);

  // A pushed 100-token prompt (13 blocks) is received outside the scheduler
  // while a local 159-token one (20 blocks) cannot be admitted (19 free).
  auto held = s.CreateSequenceForImport(100, 30);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(e->used_blocks(), 13) << "the prompt's blocks alone";
  ASSERT_TRUE(s.Submit(reqs[5], collect(5)).ok());
  // Once the scheduler has found that one short, a push is refused though a
  // block is free for it.
  absl::Status refused;
  for (int tries = 0; tries < 500 && refused.ok(); ++tries) {
    auto seq = s.CreateSequenceForImport(8, 1);
    refused = seq.status();
    if (seq.ok()) {
      s.WithEngine([&](Engine& engine) { engine.FreeSequence(*seq); });
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("wait for blocks"), std::string::npos)
      << refused;
  // The received one is submitted behind it and runs first; then the local.
  {
    absl::MutexLock lock(&mu);
    out[4].push_back(want[4][0]);
  }
  s.WithEngine([&](Engine& engine) {
    EXPECT_EQ(ComputeAndSubmit(s, engine, reqs[4], *held, collect(4)),
              want[4][0]);
  });
  if (!wait_for(4) || !wait_for(5)) return;
  s.WaitIdle();
  auto after = s.CreateSequenceForImport(8, 1);
  EXPECT_TRUE(after.ok()) << "none waits now: " << after.status();
  if (after.ok()) {
    s.WithEngine([&](Engine& engine) { engine.FreeSequence(*after); });
  }
  EXPECT_EQ(e->used_blocks(), 0);
}

TEST(SchedulerPrefixCache, SharedPrefixComputesOnlyTheRemainder) {
  const std::vector<int32_t> prefix = RandomTokens(9, 64);
  std::vector<int32_t> p1 = prefix, p2 = prefix;
  const auto s1 = RandomTokens(10, 5), s2 = RandomTokens(11, 9);
  p1.insert(p1.end(), s1.begin(), s1.end());
  p2.insert(p2.end(), s2.begin(), s2.end());
  const std::vector<GenerationRequest> reqs = {Seeded(p1, 5, 30),
                                               Seeded(p2, 6, 30)};
  const auto want = Alone(reqs);
  auto e = MakeEngine({});
  const Batch first = RunAll(*e, {}, {reqs[0]});
  EXPECT_EQ(first.stats.prefill_tokens_computed, 69);
  EXPECT_EQ(first.stats.prefix_hit_tokens, 0);
  const Batch second = RunAll(*e, {}, {reqs[1]});
  EXPECT_EQ(second.stats.prefix_hit_tokens, 64);
  EXPECT_EQ(second.stats.prefill_tokens_computed, 9);
  EXPECT_EQ(first.out.at(0).tokens, want[0]);
  EXPECT_EQ(second.out.at(0).tokens, want[1]);
  EXPECT_EQ(e->used_blocks(), 0);
  EXPECT_GT(e->stats().prefix.evictable_blocks, 0);
}

// Seeded or greedy (temperature 0) sampling with presence and frequency
// penalties, which count output tokens only.
GenerationRequest Penalized(std::vector<int32_t> prompt, uint64_t seed,
                            float temperature, int max_tokens) {
  GenerationRequest g = Seeded(std::move(prompt), seed, max_tokens);
  g.sampling.temperature = temperature;
  g.sampling.presence_penalty = 0.7f;
  g.sampling.frequency_penalty = 0.6f;
  return g;
}

// `full` resumed after its first k output tokens, as a migration does: they
// join the prompt, marked as generated, and max_tokens shrinks by k.
GenerationRequest Resumed(const GenerationRequest& full,
                          const std::vector<int32_t>& output, int k) {
  GenerationRequest r = full;
  r.prompt_ids.insert(r.prompt_ids.end(), output.begin(), output.begin() + k);
  r.generated_tokens = k;
  r.stop.max_tokens -= k;
  return r;
}

std::vector<int32_t> Tail(const std::vector<int32_t>& v, int from) {
  return std::vector<int32_t>(v.begin() + from, v.end());
}

// A request resumed with prompt P + its first k outputs marked as generated
// continues exactly like the uninterrupted request with penalties on, both
// re-prefilled by the scheduler (Submit) and with the resumed prompt's KV
// computed beforehand and the first token sampled outside, as a prefill
// worker does (SubmitWithKv). Unmarked, the penalties miss the k tokens.
TEST(Resume, EarlierOutputsMarkedAsGeneratedContinueExactly) {
  const std::vector<GenerationRequest> fulls = {
      Penalized(LoadReferences()[0].prompt_ids, 31, 0.9f, 50),
      Penalized(RandomTokens(3, 40), 32, 0.0f, 50)};
  const auto want = Alone(fulls);
  auto e = MakeEngine({});
  for (size_t i = 0; i < fulls.size(); ++i) {
    ASSERT_EQ(want[i].size(), 50u);
    for (int k : {1, 9, 30}) {
      const GenerationRequest resumed = Resumed(fulls[i], want[i], k);
      const Batch b = RunAll(*e, {}, {resumed});
      EXPECT_TRUE(b.out.at(0).status.ok()) << b.out.at(0).status;
      EXPECT_EQ(b.out.at(0).tokens, Tail(want[i], k))
          << "#" << i << " resumed after " << k;

      // The KV of the resumed prompt computed first; its first token
      // sampled from the last logits with the earlier outputs as output.
      std::vector<int32_t> tokens;
      {
        GenerationScheduler s(e.get(), {});
        absl::Mutex mu;
        s.WithEngine([&](Engine& engine) {
          auto seq = engine.CreateSequence();
          ASSERT_TRUE(seq.ok()) << seq.status();
          std::vector<float> logits;
          const Engine::ForwardItem item{*seq, resumed.prompt_ids, true};
          ASSERT_TRUE(engine.Forward({item}, &logits).ok());
          const auto prompt = absl::MakeConstSpan(resumed.prompt_ids);
          const SampledToken first = SampleToken(
              logits, resumed.sampling, prompt.first(prompt.size() - k),
              prompt.last(k), static_cast<int64_t>(prompt.size()));
          EXPECT_EQ(first.id, want[i][k]) << "#" << i << " first after " << k;
          auto id = s.SubmitWithKv(resumed, *seq, first.id,
                                   [&](const TokenEvent& ev) {
                                     absl::MutexLock lock(&mu);
                                     if (ev.has_token) {
                                       tokens.push_back(ev.token_id);
                                     }
                                   });
          ASSERT_TRUE(id.ok()) << id.status();
        });
        s.WaitIdle();
      }
      EXPECT_EQ(tokens, Tail(want[i], k + 1))
          << "#" << i << " imported, resumed after " << k;
    }
    // Without the marking, presence/frequency penalties do not count the
    // k tokens and the continuation departs from the uninterrupted one.
    GenerationRequest unmarked = Resumed(fulls[i], want[i], 30);
    unmarked.generated_tokens = 0;
    EXPECT_NE(RunAll(*e, {}, {unmarked}).out.at(0).tokens, Tail(want[i], 30))
        << "#" << i;
  }
  EXPECT_EQ(e->used_blocks(), 0);
}

TEST(Resume, GeneratedTokensMustLeaveAPrompt) {
  auto e = MakeEngine({});
  GenerationScheduler s(e.get(), {});
  GenerationRequest r = Seeded({1, 2, 3}, 1, 4);
  r.generated_tokens = 3;
  EXPECT_EQ(s.Submit(r, [](const TokenEvent&) {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  r.generated_tokens = -1;
  EXPECT_EQ(s.Submit(r, [](const TokenEvent&) {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
