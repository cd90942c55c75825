#include "common/engine/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace pdserve {

struct GenerationScheduler::Request {
  RequestId id = 0;
  GenerationRequest req;
  TokenCallback callback;
  SeqId seq = -1;         // -1 until admitted (or given by SubmitWithKv)
  bool imported = false;  // prompt KV arrived from elsewhere
  int prefilled = 0;      // prompt tokens whose KV is in the cache
  std::vector<int32_t> output;
  int32_t next_input = -1;  // sampled token to feed at the next decode step
  bool finished = false;

  int prompt_len() const { return static_cast<int>(req.prompt_ids.size()); }
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
  const int64_t total = static_cast<int64_t>(request->prompt_ids.size()) +
                        request->stop.max_tokens;
  if (total > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", request->prompt_ids.size(), " tokens) + max_tokens (",
        request->stop.max_tokens, ") exceeds the model's context of ",
        config.max_position_embeddings, " tokens"));
  }
  if (engine_->BlocksFor(total) > engine_->total_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request needs ", engine_->BlocksFor(total),
        " KV blocks, the whole pool has ", engine_->total_blocks()));
  }
  absl::Status valid = ValidateSamplingParams(request->sampling);
  if (!valid.ok()) return valid;
  if (request->stop.eos_ids.empty()) {
    request->stop.eos_ids = engine_->generation_config().eos_token_ids;
  }
  return absl::OkStatus();
}

GenerationScheduler::RequestId GenerationScheduler::Enqueue(
    std::unique_ptr<Request> request) {
  absl::MutexLock lock(&mu_);
  request->id = next_id_++;
  ++outstanding_;
  const RequestId id = request->id;
  waiting_.push_back(std::move(request));
  return id;
}

absl::StatusOr<GenerationScheduler::RequestId> GenerationScheduler::Submit(
    GenerationRequest request, TokenCallback callback) {
  absl::Status valid = ValidateRequest(&request);
  if (!valid.ok()) return valid;
  auto r = std::make_unique<Request>();
  r->req = std::move(request);
  r->callback = std::move(callback);
  return Enqueue(std::move(r));
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
  auto r = std::make_unique<Request>();
  r->req = std::move(request);
  r->callback = std::move(callback);
  r->seq = seq;
  r->imported = true;
  r->prefilled = r->prompt_len();
  r->output.push_back(first_token);
  r->next_input = first_token;
  return Enqueue(std::move(r));
}

void GenerationScheduler::Finish(Request& r, TokenEvent event) {
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
      +[](GenerationScheduler* s)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->outstanding_ == 0; },
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
      progressed = Step();
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

  // 2. Admission (FIFO): blocks for prompt + max_tokens are reserved up front
  // so a running sequence never runs out of KV.
  std::vector<std::unique_ptr<Request>> failed;
  {
    absl::MutexLock lock(&mu_);
    while (!waiting_.empty() &&
           static_cast<int>(running_.size()) < options_.max_num_seqs) {
      Request& r = *waiting_.front();
      const int total = r.prompt_len() + r.req.stop.max_tokens;
      if (r.seq < 0) {
        absl::StatusOr<SeqId> seq = engine_->CreateSequence();
        if (!seq.ok()) break;
        r.seq = *seq;
      }
      absl::Status reserved = engine_->Reserve(r.seq, total);
      if (!reserved.ok()) {
        if (reserved.code() == absl::StatusCode::kResourceExhausted) {
          if (!r.imported) {
            engine_->FreeSequence(r.seq);
            r.seq = -1;
          }
          break;  // wait for blocks to be freed
        }
        failed.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        continue;
      }
      if (r.imported && engine_->SequenceLength(r.seq) != r.prompt_len()) {
        failed.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        continue;
      }
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      progressed = true;
    }
    // Counted as running before leaving `waiting_` is visible (WaitIdle).
    num_running_ = static_cast<int>(running_.size());
  }
  for (auto& r : failed) {
    absl::Status status =
        r->imported && r->seq >= 0 &&
                engine_->SequenceLength(r->seq) != r->prompt_len()
            ? absl::FailedPreconditionError(absl::StrCat(
                  "imported sequence holds ", engine_->SequenceLength(r->seq),
                  " tokens of KV, the prompt has ", r->prompt_len()))
            : absl::InvalidArgumentError("request cannot be admitted");
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

  // 3. The batch: one token for every decoding sequence, then prompt chunks
  // within the token budget.
  std::vector<Engine::ForwardItem> items;
  std::vector<Request*> owners;
  int budget = max_batch_tokens_;
  for (auto& r : running_) {
    if (r->finished || r->prefilled < r->prompt_len() || budget <= 0) continue;
    items.push_back({r->seq, absl::MakeConstSpan(&r->next_input, 1), true});
    owners.push_back(r.get());
    --budget;
  }
  std::vector<int> chunk_sizes(owners.size(), 0);
  for (auto& r : running_) {
    if (r->finished || r->prefilled >= r->prompt_len() || budget <= 0) continue;
    int n = std::min(r->prompt_len() - r->prefilled, budget);
    if (options_.prefill_chunk_tokens > 0) {
      n = std::min(n, options_.prefill_chunk_tokens);
    }
    const bool last = r->prefilled + n == r->prompt_len();
    items.push_back(
        {r->seq,
         absl::MakeConstSpan(r->req.prompt_ids.data() + r->prefilled, n),
         last});
    owners.push_back(r.get());
    chunk_sizes.push_back(n);
    budget -= n;
  }

  if (!items.empty()) {
    progressed = true;
    absl::Status status = engine_->Forward(items, &logits_);
    const int vocab = engine_->config().vocab_size;
    for (size_t i = 0; i < items.size(); ++i) {
      Request& r = *owners[i];
      if (!status.ok()) {
        Finish(r, EndEvent("error", status));
        continue;
      }
      if (chunk_sizes[i] > 0) {
        r.prefilled += chunk_sizes[i];
        if (!items[i].want_logits) continue;
      }
      const int64_t position =
          r.prompt_len() + static_cast<int64_t>(r.output.size());
      SampledToken t = SampleToken(
          absl::MakeConstSpan(logits_.data() + i * static_cast<size_t>(vocab),
                              vocab),
          r.req.sampling, r.req.prompt_ids, r.output, position);
      const std::string reason =
          StopReason(r.req.stop, t.id, static_cast<int>(r.output.size()) + 1);
      TokenEvent event;
      event.token_id = t.id;
      event.logprob = t.logprob;
      event.top_logprobs = std::move(t.top_logprobs);
      if (reason == "stop") {
        event.has_token = false;
        event.stop_token_id = t.id;
        event.finish_reason = reason;
        Finish(r, std::move(event));
        continue;
      }
      event.has_token = true;
      r.output.push_back(t.id);
      r.next_input = t.id;
      if (!reason.empty()) {
        event.finish_reason = reason;
        Finish(r, std::move(event));
      } else {
        r.callback(event);
      }
    }
  }

  // 4. Retire finished sequences.
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
  {
    absl::MutexLock lock(&mu_);
    num_running_ = static_cast<int>(running_.size());
  }
  return progressed || removed > 0;
}

}  // namespace pdserve
