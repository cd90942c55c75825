#include "common/engine/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/engine/scheduler_request.h"

namespace pdserve {

absl::Status CheckSchedulerOptions(const SchedulerOptions& o) {
  if (o.max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_seqs must be at least 1, got ", o.max_num_seqs));
  }
  if (o.max_batch_tokens < 0 || o.prefill_chunk_tokens < 0 ||
      o.max_waiting < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_batch_tokens (", o.max_batch_tokens, "), prefill_chunk_tokens (",
        o.prefill_chunk_tokens, ") and max_waiting_seqs (", o.max_waiting,
        ") must be 0 (no limit) or more"));
  }
  if (!(o.kv_watermark >= 0 && o.kv_watermark < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_watermark must be in [0, 1), got ", o.kv_watermark));
  }
  return absl::OkStatus();
}

GenerationScheduler::GenerationScheduler(Engine* engine,
                                         const SchedulerOptions& options)
    : engine_(engine), options_(options) {
  max_batch_tokens_ = options.max_batch_tokens > 0
                          ? std::min(options.max_batch_tokens,
                                     engine->options().max_batch_tokens)
                          : engine->options().max_batch_tokens;
  thread_ = std::thread([this] { Loop(); });
}

GenerationScheduler::~GenerationScheduler() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  absl::MutexLock engine_lock(&engine_mu_);
  std::deque<std::unique_ptr<Request>> waiting;
  {
    absl::MutexLock lock(&mu_);
    waiting.swap(waiting_);
  }
  for (auto& r : waiting) {
    if (r->seq >= 0) engine_->FreeSequence(r->seq);
    Finish(*r, EndEvent("cancelled"));
  }
  for (auto& r : running_) {
    engine_->FreeSequence(r->seq);
    Finish(*r, EndEvent("cancelled"));
  }
  running_.clear();
}

absl::Status GenerationScheduler::ValidateRequest(
    GenerationRequest* request) const {
  const ModelConfig& config = engine_->config();
  if (request->prompt_ids.empty()) {
    return absl::InvalidArgumentError("empty prompt");
  }
  for (int32_t id : request->prompt_ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " outside the vocabulary [0, ",
                       config.vocab_size, ")"));
    }
  }
  // max_tokens 0: the prompt alone, computed and scored (nothing else
  // would come of it).
  if (request->stop.max_tokens < 0 ||
      (request->stop.max_tokens == 0 && request->prompt_logprobs < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be positive (0 only with "
                     "prompt_logprobs: the prompt scored alone), got ",
                     request->stop.max_tokens));
  }
  if (request->stop.min_tokens < 0 ||
      request->stop.min_tokens > request->stop.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_tokens must be in [0, max_tokens = ", request->stop.max_tokens,
        "], got ", request->stop.min_tokens));
  }
  const int64_t total = static_cast<int64_t>(request->prompt_ids.size()) +
                        request->stop.max_tokens;
  if (total > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", request->prompt_ids.size(), " tokens) + max_tokens (",
        request->stop.max_tokens, ") exceeds the model's context of ",
        config.max_position_embeddings, " tokens"));
  }
  absl::Status fits = engine_->CheckFitsPool(total);
  if (!fits.ok()) return fits;
  if (request->generated_tokens < 0 ||
      request->generated_tokens >=
          static_cast<int64_t>(request->prompt_ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generated_tokens must be in [0, prompt length ",
        request->prompt_ids.size(), "), got ", request->generated_tokens));
  }
  absl::Status valid = ValidateSamplingParams(request->sampling);
  if (!valid.ok()) return valid;
  if (request->prompt_logprobs < -1 || request->prompt_logprobs > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_logprobs must be in [0, 100] (or -1: off), got ",
                     request->prompt_logprobs));
  }
  if (request->stop.eos_ids.empty()) {
    request->stop.eos_ids = engine_->generation_config().eos_token_ids;
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerationScheduler::RequestId> GenerationScheduler::Enqueue(
    std::unique_ptr<Request> request) {
  absl::MutexLock lock(&mu_);
  // Waiting requests that will fill free batch slots do not count against
  // max_waiting (the batch admits them within a few steps), nor do finished
  // ones the next step retires: their callers have had the final event.
  // A sequence whose KV was imported is never refused (it still counts):
  // its blocks are already reserved, and refusing it would throw away a
  // prefill and a transfer for the router to redo.
  if (!request->imported && options_.max_waiting > 0 &&
      held_ >= options_.max_num_seqs + options_.max_waiting) {
    ++counters_.rejected;
    return absl::ResourceExhaustedError(
        absl::StrCat("scheduler queue full: ", held_, " requests held (max ",
                     options_.max_num_seqs, " running + ", options_.max_waiting,
                     " waiting)"));
  }
  ++held_;
  request->id = next_id_++;
  ++outstanding_;
  const RequestId id = request->id;
  waiting_.push_back(std::move(request));
  return id;
}

std::unique_ptr<GenerationScheduler::Request> GenerationScheduler::NewRequest(
    GenerationRequest request, TokenCallback callback) {
  auto r = std::make_unique<Request>();
  r->req = std::move(request);
  r->callback = std::move(callback);
  r->context = r->req.prompt_ids;
  r->scoring_prompt = r->req.prompt_logprobs >= 0;
  r->sampled_output.assign(r->req.prompt_ids.end() - r->req.generated_tokens,
                           r->req.prompt_ids.end());
  return r;
}

absl::StatusOr<GenerationScheduler::RequestId> GenerationScheduler::Submit(
    GenerationRequest request, TokenCallback callback) {
  absl::Status valid = ValidateRequest(&request);
  if (!valid.ok()) return valid;
  return Enqueue(NewRequest(std::move(request), std::move(callback)));
}

absl::StatusOr<GenerationScheduler::RequestId>
GenerationScheduler::SubmitWithKv(GenerationRequest request, SeqId seq,
                                  int32_t first_token, TokenCallback callback) {
  absl::Status valid = ValidateRequest(&request);
  if (!valid.ok()) return valid;
  if (first_token < 0 || first_token >= engine_->config().vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("first token ", first_token, " outside the vocabulary"));
  }
  auto r = NewRequest(std::move(request), std::move(callback));
  r->seq = seq;
  r->imported = true;
  r->scoring_prompt = false;  // the prefill worker scored the prompt
  r->prefilled = r->prompt_len();
  r->AddOutput(first_token);
  r->next_input = first_token;
  return Enqueue(std::move(r));
}

void GenerationScheduler::Finish(Request& r, TokenEvent event) {
  {
    absl::MutexLock lock(&mu_);
    --held_;  // before the final event: its caller may submit at once
  }
  r.Finish(std::move(event));
  absl::MutexLock lock(&mu_);
  --outstanding_;
}

void GenerationScheduler::Cancel(RequestId id) {
  absl::MutexLock lock(&mu_);
  cancelled_.push_back(id);
}

void GenerationScheduler::WithEngine(const std::function<void(Engine&)>& fn) {
  absl::MutexLock lock(&engine_mu_);
  fn(*engine_);
}

void GenerationScheduler::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](GenerationScheduler* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        // Finished sequences are retired (blocks freed) too.
        return s->outstanding_ == 0 && s->num_running_ == 0;
      },
      this));
}

int GenerationScheduler::num_running() const {
  absl::MutexLock lock(&mu_);
  return num_running_;
}

int GenerationScheduler::num_waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiting_.size());
}

SchedulerStats GenerationScheduler::stats() const {
  absl::MutexLock lock(&mu_);
  SchedulerStats s = counters_;
  s.running = num_running_;
  s.waiting = static_cast<int>(waiting_.size());
  return s;
}

void GenerationScheduler::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](GenerationScheduler* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return s->stop_ || !s->waiting_.empty() || s->num_running_ > 0 ||
                   !s->cancelled_.empty();
          },
          this));
      if (stop_) return;
    }
    bool progressed;
    {
      absl::MutexLock engine_lock(&engine_mu_);
      const absl::Time step_start = absl::Now();
      progressed = Step();
      if (progressed && options_.on_step) {
        options_.on_step(absl::ToDoubleSeconds(absl::Now() - step_start));
      }
    }
    if (!progressed) {
      // Waiting requests that do not fit yet: wait for a change or retry.
      absl::MutexLock lock(&mu_);
      std::pair<GenerationScheduler*, size_t> state(this, waiting_.size());
      mu_.AwaitWithTimeout(
          absl::Condition(
              +[](std::pair<GenerationScheduler*, size_t>* a)
                   ABSL_NO_THREAD_SAFETY_ANALYSIS {
                     return a->first->stop_ || !a->first->cancelled_.empty() ||
                            a->first->waiting_.size() != a->second;
                   },
              &state),
          absl::Milliseconds(2));
    }
  }
}

bool GenerationScheduler::Step() {
  // 1. Cancellations.
  std::vector<RequestId> cancelled;
  std::vector<std::unique_ptr<Request>> cancelled_waiting;
  {
    absl::MutexLock lock(&mu_);
    cancelled.swap(cancelled_);
    for (RequestId id : cancelled) {
      for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
        if ((*it)->id == id) {
          cancelled_waiting.push_back(std::move(*it));
          waiting_.erase(it);
          break;
        }
      }
    }
  }
  bool progressed = !cancelled.empty();
  for (auto& r : cancelled_waiting) {
    if (r->seq >= 0) engine_->FreeSequence(r->seq);
    Finish(*r, EndEvent("cancelled"));
  }
  for (auto& r : running_) {
    if (!r->finished && std::find(cancelled.begin(), cancelled.end(), r->id) !=
                            cancelled.end()) {
      Finish(*r, EndEvent("cancelled"));
    }
  }
  Retire();

  // 2. Admission, then 3. the step's plan with on-demand KV growth.
  progressed |= Admit();
  progressed |= PlanAndReserve();

  // 4. One Forward: a token for every decoding sequence, prompt chunks.
  std::vector<Engine::ForwardItem> items;
  std::vector<Request*> owners;
  const int vocab = engine_->config().vocab_size;
  std::vector<std::vector<float>> token_logits;  // per scoring item
  for (auto& r : running_) {
    if (r->step_tokens == 0 || r->finished) continue;
    if (r->prefilling()) {
      const bool last =
          r->prefilled + r->step_tokens == static_cast<int>(r->context.size());
      items.push_back({r->seq,
                       absl::MakeConstSpan(r->context.data() + r->prefilled,
                                           r->step_tokens),
                       last});
      if (r->scoring_prompt) {
        token_logits.emplace_back(static_cast<size_t>(r->step_tokens) * vocab);
        items.back().token_logits = token_logits.back().data();
      }
    } else {
      items.push_back({r->seq, absl::MakeConstSpan(&r->next_input, 1), true});
    }
    owners.push_back(r.get());
  }
  if (!items.empty()) {
    progressed = true;
    absl::Status status = engine_->Forward(items, &logits_);
    int64_t prefill_tokens = 0, decode_tokens = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      Request& r = *owners[i];
      if (!status.ok()) {
        Finish(r, EndEvent("error", status));
        continue;
      }
      if (r.prefilling()) {
        if (items[i].token_logits != nullptr) {
          ScorePromptChunk(
              absl::MakeConstSpan(items[i].token_logits,
                                  static_cast<size_t>(r.step_tokens) * vocab),
              vocab, r.req.prompt_ids, r.prefilled, r.req.prompt_logprobs,
              &r.prompt_scores);
        }
        r.prefilled += r.step_tokens;
        prefill_tokens += r.step_tokens;
        if (!items[i].want_logits) continue;
        if (r.req.stop.max_tokens == 0) {  // the prompt alone: scored, done
          TokenEvent event;
          event.has_token = false;
          event.prompt_logprobs = std::move(r.prompt_scores);
          r.scoring_prompt = false;
          event.finish_reason = "length";
          Finish(r, std::move(event));
          continue;
        }
      } else {
        ++decode_tokens;
      }
      const int64_t position =
          r.prompt_len() + static_cast<int64_t>(r.output.size());
      SampledToken t = SampleToken(
          absl::MakeConstSpan(logits_.data() + i * static_cast<size_t>(vocab),
                              vocab),
          r.req.sampling, r.sampled_prompt(), r.sampled_output, position,
          StopIdsBanned(r.req.stop, static_cast<int>(r.output.size())));
      const std::string reason =
          StopReason(r.req.stop, t.id, static_cast<int>(r.output.size()) + 1);
      TokenEvent event;
      event.token_id = t.id;
      event.logprob = t.logprob;
      event.top_logprobs = std::move(t.top_logprobs);
      if (r.scoring_prompt) {
        event.prompt_logprobs = std::move(r.prompt_scores);
        r.scoring_prompt = false;
      }
      if (reason == "stop") {
        event.has_token = false;
        event.stop_token_id = t.id;
        event.finish_reason = reason;
        Finish(r, std::move(event));
        continue;
      }
      event.has_token = true;
      r.AddOutput(t.id);
      r.next_input = t.id;
      if (!reason.empty()) {
        event.finish_reason = reason;
        Finish(r, std::move(event));
      } else {
        r.callback(event);
      }
    }
    absl::MutexLock lock(&mu_);
    counters_.prefill_tokens_computed += prefill_tokens;
    counters_.decode_tokens += decode_tokens;
  }

  // 5. Retire finished sequences.
  return Retire() || progressed;
}

bool GenerationScheduler::Retire() {
  int removed = 0;
  for (auto& r : running_) {
    if (r->finished) {
      engine_->FreeSequence(r->seq);
      ++removed;
    }
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const std::unique_ptr<Request>& r) {
                                  return r->finished;
                                }),
                 running_.end());
  absl::MutexLock lock(&mu_);
  num_running_ = static_cast<int>(running_.size());
  return removed > 0;
}

}  // namespace pdserve
