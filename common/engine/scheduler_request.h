// GenerationScheduler's internals shared by its two source files
// (scheduler.cc: submission, the loop, each step's forward pass and
// sampling; scheduler_admission.cc: admission, KV planning, preemption):
// one request's state, owned and touched by the scheduler thread only.
#ifndef PDSERVE_COMMON_ENGINE_SCHEDULER_REQUEST_H_
#define PDSERVE_COMMON_ENGINE_SCHEDULER_REQUEST_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/engine/scheduler.h"

namespace pdserve {

// One submitted request's state, from Submit to its final event (scheduler
// thread only once enqueued).
struct GenerationScheduler::Request {
  RequestId id = 0;
  GenerationRequest req;
  TokenCallback callback;
  SeqId seq = -1;         // -1 until admitted (or given by SubmitWithKv)
  bool imported = false;  // prompt KV arrived from elsewhere
  // Tokens whose KV must be in the cache before the next sample: the prompt,
  // or prompt + output after a preemption (the re-prefill).
  std::vector<int32_t> context;
  int prefilled = 0;  // tokens of `context` whose KV is in the cache
  std::vector<int32_t> output;
  // What the sampler counts as output: the earlier outputs at the prompt's
  // tail (req.generated_tokens), then `output`.
  std::vector<int32_t> sampled_output;
  int32_t next_input = -1;  // sampled token to feed at the next decode step
  bool finished = false;
  int step_tokens = 0;  // tokens planned for the current step
  // Prompt logprobs: scored as the prompt's chunks pass (again after a
  // preemption before the first token: the same bits), sent with the first
  // event.
  bool scoring_prompt = false;
  std::vector<SampledToken> prompt_scores;

  int prompt_len() const { return static_cast<int>(req.prompt_ids.size()); }
  // The prompt proper, without the earlier outputs at its tail.
  absl::Span<const int32_t> sampled_prompt() const {
    return absl::MakeConstSpan(req.prompt_ids)
        .first(req.prompt_ids.size() - req.generated_tokens);
  }
  void AddOutput(int32_t id) {
    output.push_back(id);
    sampled_output.push_back(id);
  }
  bool prefilling() const {
    return prefilled < static_cast<int>(context.size());
  }
  void Finish(TokenEvent event) {
    event.finished = true;
    finished = true;
    callback(event);
  }
};

inline TokenEvent EndEvent(const std::string& reason,
                           absl::Status status = {}) {
  TokenEvent e;
  e.finished = true;
  e.finish_reason = reason;
  e.status = std::move(status);
  return e;
}

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_SCHEDULER_REQUEST_H_
