// Token sampling: penalties, temperature, top-k / top-p / min-p filters and a
// counter-based random draw (Philox4x32-10 keyed by (seed, position)), so any
// worker can sample any position of a stream and get the same token. Also
// stop-condition checks. Pure functions; thread-safe.
#ifndef PDSERVE_COMMON_SAMPLING_SAMPLER_H_
#define PDSERVE_COMMON_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pdserve {

struct SamplingParams {
  float temperature = 1.0f;  // 0 => greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0 => off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // HF style, on prompt + output tokens
  float presence_penalty = 0.0f;    // vLLM style, on output tokens
  float frequency_penalty = 0.0f;   // vLLM style, on output tokens
  uint64_t seed = 0;
  int top_logprobs = 0;  // return the K most likely tokens (raw logprobs)
  // (token id, value added to its logit after the penalties, before the
  // temperature), ids ascending and unique; ids outside the vocabulary are
  // skipped. Logprobs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

struct StopParams {
  std::vector<int32_t> eos_ids;  // the generation config's eos ids
  std::vector<int32_t> stop_token_ids;
  int max_tokens = 16;
  bool ignore_eos = false;
  // Until the output has this many tokens, the ids that would end it (eos
  // unless ignore_eos, stop_token_ids) are not sampled (StopIdsBanned).
  int min_tokens = 0;
};

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;  // log_softmax of the raw logits
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first
  // ScoreToken only: 1 + the tokens ranked before `id` (larger logit, or
  // equal with a smaller id: the order of top_logprobs); 0 when not set.
  int32_t rank = 0;
};

// Checks ranges (temperature >= 0, top_p in (0, 1], ...); INVALID_ARGUMENT.
absl::Status ValidateSamplingParams(const SamplingParams& params);

// position = the index of the token being sampled in the full sequence
// (prompt_len + number of tokens generated before it). `banned` ids are
// never sampled (their logits become -inf after the penalties and biases);
// their logprobs stay the raw ones.
SampledToken SampleToken(absl::Span<const float> logits,
                         const SamplingParams& params,
                         absl::Span<const int32_t> prompt_ids,
                         absl::Span<const int32_t> output_ids, int64_t position,
                         absl::Span<const int32_t> banned = {});

// The raw logprob of `id` under `logits` and the top_logprobs most likely
// tokens', exactly as SampleToken reports a sampled token's (prompt
// logprobs: the logits of position t scoring the prompt's token t + 1).
SampledToken ScoreToken(absl::Span<const float> logits, int32_t id,
                        int top_logprobs);

// Prompt logprobs of one prefill chunk: `token_logits` holds the logits of
// prompt positions [begin, begin + n), n = token_logits.size() / vocab;
// scores[t] (scores sized prompt.size() - 1) becomes ScoreToken of prompt
// token t + 1 under position t's logits, for each t in the chunk.
void ScorePromptChunk(absl::Span<const float> token_logits, int vocab,
                      absl::Span<const int32_t> prompt, int begin,
                      int top_logprobs, std::vector<SampledToken>* scores);

// The ids SampleToken must not pick for the token after `output_len`
// tokens of output: eos (unless ignore_eos) and stop_token_ids while
// output_len < min_tokens, else none.
std::vector<int32_t> StopIdsBanned(const StopParams& stop, int output_len);

// Whether `token` (just sampled, not yet appended) ends generation, and why:
// "stop" for an eos id (unless ignore_eos) or a stop id (the token is then
// not part of the output), "length" when output_len (after appending) reaches
// max_tokens. Returns "" to continue.
std::string StopReason(const StopParams& stop, int32_t token,
                       int output_len_after_append);

// Philox4x32-10 of (counter, key): exposed for tests.
void Philox4x32(const uint32_t counter[4], const uint32_t key[2],
                uint32_t out[4]);
// Uniform double in [0, 1) from (seed, position).
double UniformForPosition(uint64_t seed, int64_t position);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_SAMPLING_SAMPLER_H_
