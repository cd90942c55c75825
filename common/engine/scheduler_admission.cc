// GenerationScheduler: admission of waiting requests (prefix reuse, the KV
// watermark, failures), each step's KV planning and preemption. Scheduler
// thread only (the waiting queue under mu_).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/engine/scheduler.h"
#include "common/engine/scheduler_request.h"

namespace pdserve {

absl::Status GenerationScheduler::AdmitOne(Request& r, int64_t* hit_tokens) {
  const int total = r.prompt_len() + r.req.stop.max_tokens;
  absl::Status status;
  if (r.imported) {
    // The KV is already here (its receiver reserved the prompt's blocks).
    if (options_.reserve_full_request) {
      status = engine_->Reserve(r.seq, total);
      if (!status.ok()) return status;
    }
    if (engine_->SequenceLength(r.seq) != r.prompt_len()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "imported sequence holds ", engine_->SequenceLength(r.seq),
          " tokens of KV, the prompt has ", r.prompt_len()));
    }
    return absl::OkStatus();
  }
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
  const int64_t watermark = running_.empty()
                                ? 0
                                : static_cast<int64_t>(options_.kv_watermark *
                                                       engine_->total_blocks());
  if (status.ok() && engine_->free_blocks() - need < watermark) {
    status = absl::ResourceExhaustedError("below the KV watermark");
  }
  if (status.ok()) status = engine_->Reserve(r.seq, need_tokens);
  if (absl::IsResourceExhausted(status)) {
    engine_->FreeSequence(r.seq);  // attached blocks stay cached
    r.seq = -1;
    return status;
  }
  if (status.ok()) {
    r.prefilled = reused;
    *hit_tokens += reused;
  }
  return status;
}

bool GenerationScheduler::Admit() {
  bool admitted = false;
  std::vector<std::pair<std::unique_ptr<Request>, absl::Status>> failed;
  int64_t hit_tokens = 0;
  {
    absl::MutexLock lock(&mu_);
    // FIFO among requests that need blocks: once one is short, those behind
    // it wait too. An imported request needs none (its receiver reserved
    // them) and is admitted past it: waiting, it would hold its prompt's
    // blocks out of reach of the one in front (which, with nothing running
    // to free more, could then never be admitted).
    waiting_for_blocks_ = false;
    auto it = waiting_.begin();
    while (it != waiting_.end() &&
           static_cast<int>(running_.size()) < options_.max_num_seqs) {
      Request& r = **it;
      const bool needs_blocks = !r.imported || options_.reserve_full_request;
      if (waiting_for_blocks_ && needs_blocks) {
        ++it;
        continue;
      }
      absl::Status status = AdmitOne(r, &hit_tokens);
      if (absl::IsResourceExhausted(status)) {
        waiting_for_blocks_ = true;  // wait for blocks to be freed
        ++it;
        continue;
      }
      if (!status.ok()) {
        failed.emplace_back(std::move(*it), status);
      } else {
        running_.push_back(std::move(*it));
        admitted = true;
      }
      it = waiting_.erase(it);
    }
    // Counted as running before leaving `waiting_` is visible (WaitIdle).
    num_running_ = static_cast<int>(running_.size());
    counters_.prefix_hit_tokens += hit_tokens;
  }
  for (auto& [r, status] : failed) {
    if (r->seq >= 0) engine_->FreeSequence(r->seq);
    Finish(*r, EndEvent("error", status));
  }
  // An imported request may already be complete (max_tokens == 1); a
  // prompt-only one (max_tokens 0) ends when its prompt is computed.
  for (auto& r : running_) {
    if (!r->finished && !r->prefilling() &&
        static_cast<int>(r->output.size()) >= r->req.stop.max_tokens) {
      Finish(*r, EndEvent("length"));
    }
  }
  return admitted || !failed.empty();
}

absl::StatusOr<SeqId> GenerationScheduler::CreateSequenceForImport(
    int prompt_tokens, int max_tokens) {
  const int total = prompt_tokens + std::max(0, max_tokens);
  absl::MutexLock engine_lock(&engine_mu_);
  absl::Status fits = engine_->CheckFitsPool(total);
  if (!fits.ok()) return fits;
  const int reserve_tokens =
      options_.reserve_full_request ? total : prompt_tokens;
  const int64_t need = engine_->BlocksFor(reserve_tokens);
  {
    absl::MutexLock lock(&mu_);
    if (waiting_for_blocks_) {
      return absl::ResourceExhaustedError(
          "KV cache full: requests queued here already wait for blocks");
    }
  }
  const int64_t watermark = running_.empty()
                                ? 0
                                : static_cast<int64_t>(options_.kv_watermark *
                                                       engine_->total_blocks());
  if (engine_->free_blocks() - need < watermark) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: ", need, " blocks for ", reserve_tokens, " tokens, ",
        engine_->free_blocks(), " of ", engine_->total_blocks(), " free",
        watermark > 0
            ? absl::StrCat(" (", watermark, " kept for running sequences)")
            : ""));
  }
  absl::StatusOr<SeqId> seq = engine_->CreateSequence();
  if (!seq.ok()) return seq;
  absl::Status s = engine_->Reserve(*seq, reserve_tokens);
  if (!s.ok()) {
    engine_->FreeSequence(*seq);
    return s;
  }
  return seq;
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
