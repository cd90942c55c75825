#include "common/engine/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace pdserve {

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

namespace {

TokenEvent EndEvent(const std::string& reason, absl::Status status = {}) {
  TokenEvent e;
  e.finished = true;
  e.finish_reason = reason;
  e.status = std::move(status);
  return e;
}

}  // namespace

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
  if (request->stop.max_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_tokens must be positive, got ", request->stop.max_tokens));
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

bool GenerationScheduler::Admit() {
  bool admitted = false;
  std::vector<std::pair<std::unique_ptr<Request>, absl::Status>> failed;
  int64_t hit_tokens = 0;
  {
    absl::MutexLock lock(&mu_);
    while (!waiting_.empty() &&
           static_cast<int>(running_.size()) < options_.max_num_seqs) {
      Request& r = *waiting_.front();
      const int total = r.prompt_len() + r.req.stop.max_tokens;
      absl::Status status;
      if (r.imported) {
        // The KV is already here (and was reserved by its receiver).
        if (options_.reserve_full_request) {
          status = engine_->Reserve(r.seq, total);
          if (status.code() == absl::StatusCode::kResourceExhausted) break;
        }
        if (status.ok() && engine_->SequenceLength(r.seq) != r.prompt_len()) {
          status = absl::FailedPreconditionError(absl::StrCat(
              "imported sequence holds ", engine_->SequenceLength(r.seq),
              " tokens of KV, the prompt has ", r.prompt_len()));
        }
      } else {
        if (r.seq < 0) r.seq = *engine_->CreateSequence();
        int reused = 0;
        if (options_.use_prefix_cache && !r.scoring_prompt) {
          absl::StatusOr<int> attached =
              engine_->AttachCachedPrefix(r.seq, r.context);
          if (attached.ok()) {
            reused = *attached;
          } else {
            status = attached.status();
          }
        }
        const int need_tokens = options_.reserve_full_request
                                    ? total
                                    : static_cast<int>(r.context.size());
        const int64_t need =
            engine_->BlocksFor(need_tokens) - engine_->BlocksFor(reused);
        const int64_t watermark =
            running_.empty() ? 0
                             : static_cast<int64_t>(options_.kv_watermark *
                                                    engine_->total_blocks());
        if (status.ok() && engine_->free_blocks() - need < watermark) {
          engine_->FreeSequence(r.seq);  // attached blocks stay cached
          r.seq = -1;
          break;  // FIFO: wait for blocks to be freed
        }
        if (status.ok()) status = engine_->Reserve(r.seq, need_tokens);
        if (status.code() == absl::StatusCode::kResourceExhausted) {
          engine_->FreeSequence(r.seq);
          r.seq = -1;
          break;
        }
        r.prefilled = reused;
        hit_tokens += reused;
      }
      if (!status.ok()) {
        failed.emplace_back(std::move(waiting_.front()), status);
        waiting_.pop_front();
        continue;
      }
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      admitted = true;
    }
    // Counted as running before leaving `waiting_` is visible (WaitIdle).
    num_running_ = static_cast<int>(running_.size());
    counters_.prefix_hit_tokens += hit_tokens;
  }
  for (auto& [r, status] : failed) {
    if (r->seq >= 0) engine_->FreeSequence(r->seq);
    Finish(*r, EndEvent("error", status));
  }
  // An imported request may already be complete (max_tokens == 1).
  for (auto& r : running_) {
    if (!r->finished &&
        static_cast<int>(r->output.size()) >= r->req.stop.max_tokens) {
      Finish(*r, EndEvent("length"));
    }
  }
  return admitted || !failed.empty();
}

bool GenerationScheduler::PlanAndReserve() {
  // Decoding sequences first (one token each), then prompt chunks.
  int budget = max_batch_tokens_;
  for (auto& r : running_) {
    r->step_tokens = 0;
    if (r->finished || r->prefilling() || budget <= 0) continue;
    r->step_tokens = 1;
    --budget;
  }
  for (auto& r : running_) {
    if (r->finished || !r->prefilling() || budget <= 0) continue;
    int n =
        std::min(static_cast<int>(r->context.size()) - r->prefilled, budget);
    if (options_.prefill_chunk_tokens > 0) {
      n = std::min(n, options_.prefill_chunk_tokens);
    }
    if (r->scoring_prompt) n = std::min(n, kPromptLogprobsChunkTokens);
    r->step_tokens = n;
    budget -= n;
  }
  // KV on demand, oldest first; the newest sequences make room.
  bool preempted = false;
  for (size_t i = 0; i < running_.size(); ++i) {
    Request& r = *running_[i];
    if (r.step_tokens == 0) continue;
    const int want = engine_->SequenceLength(r.seq) + r.step_tokens;
    for (;;) {
      absl::Status status = engine_->Reserve(r.seq, want);
      if (status.ok()) break;
      if (status.code() != absl::StatusCode::kResourceExhausted) {
        r.step_tokens = 0;
        Finish(r, EndEvent("error", status));
        break;
      }
      if (running_.size() == 1) {
        // Alone and still short: blocks are held outside the scheduler
        // (e.g. KV being received); wait for them.
        r.step_tokens = 0;
        break;
      }
      const size_t victim = running_.size() - 1;
      Preempt(victim);
      preempted = true;
      if (victim == i) break;  // `r` itself was the newest
    }
  }
  return preempted;
}

void GenerationScheduler::Preempt(size_t index) {
  std::unique_ptr<Request> r = std::move(running_[index]);
  running_.erase(running_.begin() + index);
  // Its registered full blocks stay cached: the re-prefill may reattach them.
  engine_->FreeSequence(r->seq);
  r->seq = -1;
  r->imported = false;
  r->context = r->req.prompt_ids;
  r->context.insert(r->context.end(), r->output.begin(), r->output.end());
  r->prefilled = 0;
  r->step_tokens = 0;
  absl::MutexLock lock(&mu_);
  ++counters_.preemptions;
  // Ahead of new requests; a later preemption (an older sequence) goes
  // in front of an earlier one.
  waiting_.push_front(std::move(r));
  num_running_ = static_cast<int>(running_.size());
}

}  // namespace pdserve
