#include "prefill_worker/prefill_worker.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_util/cancellation_poll.h"
#include "common/grpc_util/grpc_util.h"
#include "common/sampling/sampler.h"
#include "common/transport/kv_wire.h"
#include "common/transport/sequence_spec.h"
#include "common/util/logging.h"

namespace pdserve {

// One Prefill call. Written by the compute thread, read by the handler once
// `done` is set (under PrefillWorker::mu_, as everything here is).
struct PrefillWorker::Job {
  pb::PrefillRequest request;
  absl::Time arrival;
  bool cancelled = false;
  bool done = false;
  // The handler waits on its own job's: a waiter per handler on mu_ itself
  // would make every unlock of mu_ test every waiting handler's condition.
  absl::CondVar finished;
  absl::Status status;
  pb::PrefillResponse response;

  // Ends the call with `s` (and `response` if OK) and wakes its handler.
  void Finish(absl::Status s) {
    status = std::move(s);
    done = true;
    finished.Signal();
  }
};

PrefillWorker::PrefillWorker(const PrefillWorkerOptions& options,
                             transport::KvSender* sender)
    : options_(options), sender_(sender) {}

absl::StatusOr<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(
    const PrefillWorkerOptions& options, transport::KvSender* sender) {
  if (options.metrics == nullptr) {
    return absl::InvalidArgumentError("PrefillWorkerOptions.metrics is null");
  }
  if (options.max_queue < 0 || options.max_batch_tokens < 0 ||
      options.prefill_chunk_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_prefill_queue (", options.max_queue, "), max_prefill_tokens (",
        options.max_batch_tokens, ") and prefill_chunk_tokens (",
        options.prefill_chunk_tokens, ") must be 0 (no limit) or more"));
  }
  std::unique_ptr<PrefillWorker> w(new PrefillWorker(options, sender));
  w->push_counters_.metrics = options.metrics;
  auto engine = Engine::Create(options.engine);
  if (!engine.ok()) return engine.status();
  w->engine_ = *std::move(engine);
  w->max_batch_tokens_ =
      options.max_batch_tokens > 0
          ? std::min(options.max_batch_tokens, options.engine.max_batch_tokens)
          : options.engine.max_batch_tokens;
  w->chunk_tokens_ = options.prefill_chunk_tokens;
  const char* parallel = std::getenv("PDSERVE_KV_EXPORT_PARALLEL");
  w->parallel_export_ = parallel == nullptr || std::string(parallel) != "0";
  w->fingerprint_ = w->engine_->fingerprint();
  w->layout_ = w->engine_->kv_layout();
  w->free_blocks_ = w->engine_->free_blocks();
  w->total_blocks_ = w->engine_->total_blocks();
  w->ExportKvPool();
  w->compute_ = std::thread([p = w.get()] { p->ComputeLoop(); });
  return w;
}

PrefillWorker::~PrefillWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [id, push] : pushes_) push->Cancel();
  }
  // Not started when Create failed before its thread.
  if (compute_.joinable()) compute_.join();
  absl::MutexLock lock(&mu_);
  pushes_.clear();  // joins the pipelines
}

std::vector<grpc::Service*> PrefillWorker::services() {
  return {static_cast<pb::Prefill::Service*>(this),
          static_cast<pb::Worker::Service*>(this)};
}

int PrefillWorker::active_work() const {
  absl::MutexLock lock(&mu_);
  int pushes = 0;
  for (const auto& [id, p] : pushes_) pushes += p->done() ? 0 : 1;
  return in_flight_.load() + pushes;
}

grpc::Status PrefillWorker::Prefill(grpc::ServerContext* context,
                                    const pb::PrefillRequest* request,
                                    pb::PrefillResponse* response) {
  if (draining_.load()) {
    return ToGrpcStatus(absl::UnavailableError("prefill worker is draining"));
  }
  const pb::SequenceSpec& spec = request->seq();
  if (spec.request_id().empty() || spec.prompt_ids().empty()) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("empty request id or prompt"));
  }
  const int vocab = engine_->config().vocab_size;
  for (int32_t id : spec.prompt_ids()) {
    if (id < 0 || id >= vocab) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " outside the vocabulary")));
    }
  }
  if (spec.generated_tokens() < 0 ||
      spec.generated_tokens() >= spec.prompt_ids_size()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "generated_tokens must be in [0, prompt length)"));
  }
  if (spec.has_prompt_logprobs() &&
      (spec.prompt_logprobs() < 0 || spec.prompt_logprobs() > 100)) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("prompt_logprobs must be in [0, 100]"));
  }
  if (spec.stop().max_tokens() < 0 ||
      (spec.stop().max_tokens() == 0 && !spec.has_prompt_logprobs())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "max_tokens must be positive (0 only with prompt_logprobs: the "
        "prompt scored alone)"));
  }
  if (spec.stop().max_tokens() > 0 && request->decode_target().empty()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "decode_target is required: the KV of a request that generates is "
        "pushed there (only a prompt-only request, max_tokens 0, has none)"));
  }
  if (spec.prompt_ids_size() + spec.stop().max_tokens() >
      engine_->config().max_position_embeddings) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("prompt + max_tokens beyond context"));
  }
  // A prompt larger than this worker's whole pool would only fail once
  // dequeued; OUT_OF_RANGE now lets the router try elsewhere.
  absl::Status fits = engine_->CheckFitsPool(spec.prompt_ids_size());
  if (!fits.ok()) return ToGrpcStatus(fits);
  auto job = std::make_shared<Job>();
  job->request = *request;
  job->arrival = absl::Now();
  in_flight_.fetch_add(1);
  absl::MutexLock lock(&mu_);
  if (jobs_.count(spec.request_id()) > 0) {
    in_flight_.fetch_sub(1);
    return ToGrpcStatus(absl::AlreadyExistsError("duplicate request id"));
  }
  if (options_.max_queue > 0 &&
      static_cast<int>(queue_.size()) >= options_.max_queue) {
    in_flight_.fetch_sub(1);
    rejected_.fetch_add(1);
    return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
        "prefill queue full (", queue_.size(), " prompts waiting)")));
  }
  jobs_[spec.request_id()] = job;
  queue_.push_back(job);
  queued_tokens_.fetch_add(spec.prompt_ids_size());
  options_.metrics->SetQueueDepth(static_cast<int64_t>(queue_.size()));
  CancellationPoll poll;
  while (!job->done) {
    job->finished.WaitWithTimeout(&mu_, poll.Interval());
    if (!job->done && context->IsCancelled()) {
      job->cancelled = true;
      auto it = pushes_.find(spec.request_id());
      if (it != pushes_.end()) it->second->Cancel();
      break;
    }
  }
  jobs_.erase(spec.request_id());
  in_flight_.fetch_sub(1);
  queued_tokens_.fetch_sub(spec.prompt_ids_size());
  if (job->cancelled && !job->done) {
    cancelled_.fetch_add(1);
    return ToGrpcStatus(absl::CancelledError("prefill cancelled"));
  }
  if (!job->status.ok()) return ToGrpcStatus(job->status);
  *response = job->response;
  completed_.fetch_add(1);
  return grpc::Status::OK;
}

// A prompt being prefilled: created when the compute thread takes its job
// from the queue, finished (answered, KV committed) right after the pass
// that computes its last token. Compute thread only.
struct PrefillWorker::Item {
  std::shared_ptr<Job> job;
  SeqId seq = -1;
  std::vector<int32_t> prompt;
  int done_tokens = 0;
  int reused_tokens = 0;         // from the prefix cache
  PushPipeline* push = nullptr;  // none for a prompt-only request
  double queue_seconds = 0;
  absl::Time start;
  bool finished = false;  // answered by FinishItem
  // The request scores its prompt (spec.prompt_logprobs): every chunk's
  // logits score the next tokens; no cached prefix is attached.
  bool scoring_prompt = false;
  std::vector<SampledToken> prompt_scores;
  int remaining() const {
    return static_cast<int>(prompt.size()) - done_tokens;
  }
};

int PrefillWorker::PassTokens(int remaining) const {
  return chunk_tokens_ > 0 ? std::min(remaining, chunk_tokens_) : remaining;
}

void PrefillWorker::ComputeLoop() {
  std::vector<Item> active;  // prompts part-way through their prefill
  while (true) {
    std::vector<std::shared_ptr<Job>> admitted;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      if (active.empty()) {
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200));
      }
      ReapPushes();
      if (stop_) {
        for (auto& job : queue_) {
          job->Finish(absl::UnavailableError("prefill worker shutting down"));
        }
        queue_.clear();
        for (Item& it : active) {
          if (it.push != nullptr) it.push->Cancel();
          engine_->FreeSequence(it.seq);
          it.job->Finish(
              absl::UnavailableError("prefill worker shutting down"));
        }
        return;
      }
      // Queued prompts join between passes while this pass's token budget
      // has room (at least one when nothing is running): a long prompt,
      // computed a chunk per pass, does not hold back the short ones.
      int tokens = 0;
      for (const Item& it : active) tokens += PassTokens(it.remaining());
      while (!queue_.empty()) {
        auto& job = queue_.front();
        if (job->cancelled) {
          queue_.pop_front();
          continue;
        }
        const int n = PassTokens(job->request.seq().prompt_ids_size());
        const bool first = active.empty() && admitted.empty();
        if (!first && tokens + n > max_batch_tokens_) break;
        tokens += n;
        admitted.push_back(std::move(job));
        queue_.pop_front();
      }
      options_.metrics->SetQueueDepth(static_cast<int64_t>(queue_.size()));
    }
    if (!admitted.empty() &&
        options_.testonly_prefill_delay > absl::ZeroDuration()) {
      absl::SleepFor(options_.testonly_prefill_delay);
    }
    for (auto& job : admitted) {
      if (auto item = StartItem(job)) active.push_back(*std::move(item));
    }
    DropCancelled(active);
    if (!active.empty()) RunPass(active);
  }
}

void PrefillWorker::ReapPushes() {
  for (auto it = pushes_.begin(); it != pushes_.end();) {
    if (it->second->done()) {
      it = pushes_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<PrefillWorker::Item> PrefillWorker::StartItem(
    const std::shared_ptr<Job>& job) {
  Item it;
  it.job = job;
  it.start = absl::Now();
  const pb::SequenceSpec& spec = job->request.seq();
  it.prompt.assign(spec.prompt_ids().begin(), spec.prompt_ids().end());
  it.queue_seconds = absl::ToDoubleSeconds(it.start - job->arrival);
  absl::StatusOr<SeqId> seq = engine_->CreateSequence();
  absl::Status s = seq.status();
  int reused = 0;
  if (seq.ok()) {
    // Cached full blocks of an earlier prompt with the same prefix: only
    // the rest is computed (bit-identical KV and logits).
    it.scoring_prompt = spec.has_prompt_logprobs();
    absl::StatusOr<int> attached =
        it.scoring_prompt ? 0 : engine_->AttachCachedPrefix(*seq, it.prompt);
    s = attached.status();
    if (attached.ok()) {
      reused = *attached;
      s = engine_->Reserve(*seq, static_cast<int>(it.prompt.size()));
    }
    if (!s.ok()) engine_->FreeSequence(*seq);
  }
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    job->Finish(absl::ResourceExhaustedError(
        absl::StrCat("prefill worker KV pool full: ", s.message())));
    return std::nullopt;
  }
  it.seq = *seq;
  it.done_tokens = reused;
  it.reused_tokens = reused;
  prefix_hit_tokens_.fetch_add(reused);
  options_.metrics->compute().ObservePrefixLookup(
      static_cast<int64_t>(it.prompt.size()), reused);
  // A prompt-only request (max_tokens 0): its scores are all it returns;
  // no KV leaves (a scoring request reuses no prefix either).
  if (spec.stop().max_tokens() == 0) return it;
  // Open the push now: chunks leave as soon as each layer is computed.
  pb::KvHeader header;
  header.set_request_id(spec.request_id());
  header.set_model_fingerprint(fingerprint_);
  *header.mutable_layout() = transport::LayoutToProto(layout_);
  header.set_num_tokens(static_cast<int>(it.prompt.size()));
  *header.mutable_seq() = spec;
  auto push = std::make_unique<PushPipeline>(
      sender_, job->request.decode_target(), std::move(header),
      absl::Now() + options_.push_timeout, &push_counters_);
  it.push = push.get();
  {
    absl::MutexLock lock(&mu_);
    pushes_[spec.request_id()] = std::move(push);
    if (job->cancelled) it.push->Cancel();
  }
  // The reused range leaves at once, ahead of each layer's computed part.
  for (int layer = 0; layer < layout_.num_layers && reused > 0; ++layer) {
    const KvExportRange range{it.seq, 0, reused, it.push};
    ExportLayerChunks(layer, absl::MakeConstSpan(&range, 1));
  }
  return it;
}

void PrefillWorker::DropCancelled(std::vector<Item>& active) {
  std::erase_if(active, [this](Item& it) {
    {
      absl::MutexLock lock(&mu_);
      if (!it.job->cancelled) return false;
    }
    // The caller is gone (or the router aborted): stop computing for it.
    if (it.push != nullptr) it.push->Cancel();
    engine_->FreeSequence(it.seq);
    absl::MutexLock lock(&mu_);
    it.job->Finish(absl::CancelledError("prefill cancelled"));
    return true;
  });
}

void PrefillWorker::RunPass(std::vector<Item>& active) {
  // Each prompt contributes its next chunk (oldest first) within the budget.
  std::vector<Engine::ForwardItem> fwd;
  std::vector<std::pair<size_t, std::pair<int, int>>> ranges;  // item, [b, e)
  std::vector<std::vector<float>> token_logits;  // of the scoring items
  const int vocab = engine_->config().vocab_size;
  int budget = max_batch_tokens_;
  for (size_t i = 0; i < active.size() && budget > 0; ++i) {
    Item& it = active[i];
    int n = std::min(PassTokens(it.remaining()), budget);
    if (it.scoring_prompt) n = std::min(n, kPromptLogprobsChunkTokens);
    if (n <= 0) continue;
    budget -= n;
    const int b = it.done_tokens;
    Engine::ForwardItem f;
    f.seq = it.seq;
    f.tokens = absl::MakeConstSpan(it.prompt).subspan(b, n);
    f.want_logits = (b + n == static_cast<int>(it.prompt.size()));
    if (it.scoring_prompt) {
      token_logits.emplace_back(static_cast<size_t>(n) * vocab);
      f.token_logits = token_logits.back().data();
    }
    fwd.push_back(f);
    ranges.push_back({i, {b, b + n}});
  }
  std::vector<float> logits;
  absl::Status status;
  if (!fwd.empty()) {
    int forward_tokens = 0;
    for (const auto& f : fwd)
      forward_tokens += static_cast<int>(f.tokens.size());
    options_.metrics->ObserveBatch(static_cast<int64_t>(fwd.size()),
                                   forward_tokens);
    ExportKvPool();
    std::vector<KvExportRange> exports;
    for (const auto& [i, range] : ranges) {
      if (active[i].push == nullptr) continue;  // prompt-only
      exports.push_back(
          {active[i].seq, range.first, range.second, active[i].push});
    }
    auto on_layer_done = [&](int layer) { ExportLayerChunks(layer, exports); };
    const absl::Time pass_start = absl::Now();
    status = engine_->Forward(fwd, &logits, on_layer_done);
    // What sealing the pass's KV (and any reused prefix's, at admission)
    // held its compute threads up: the push's cost on the prefill's path.
    options_.metrics->ObserveKvExport(pass_export_seconds_);
    pass_export_seconds_ = 0;
    // The cost fit (--mode=auto) samples forward passes, seconds against the
    // prompt tokens computed in them: a request's own elapsed time would
    // include the other prompts' chunks sharing its passes.
    if (status.ok()) {
      prefill_cost_.Add(forward_tokens,
                        absl::ToDoubleSeconds(absl::Now() - pass_start));
    }
  }
  for (size_t k = 0; k < ranges.size(); ++k) {
    Item& it = active[ranges[k].first];
    if (!status.ok()) {
      FinishItem(it, status, {});
      continue;
    }
    if (fwd[k].token_logits != nullptr) {
      ScorePromptChunk(absl::MakeConstSpan(
                           fwd[k].token_logits,
                           fwd[k].tokens.size() * static_cast<size_t>(vocab)),
                       vocab, it.prompt, it.done_tokens,
                       it.job->request.seq().prompt_logprobs(),
                       &it.prompt_scores);
    }
    it.done_tokens = ranges[k].second.second;
    prefill_tokens_.fetch_add(ranges[k].second.second - ranges[k].second.first);
    if (fwd[k].want_logits) {
      FinishItem(it, status,
                 absl::MakeConstSpan(logits).subspan(k * vocab, vocab));
    }
  }
  std::erase_if(active, [](const Item& it) { return it.finished; });
  free_blocks_ = engine_->free_blocks();
  total_blocks_ = engine_->total_blocks();
  prefix_cached_blocks_ = engine_->stats().prefix.cached_blocks;
  ExportKvPool();
}

void PrefillWorker::FinishItem(Item& it, const absl::Status& status,
                               absl::Span<const float> last_logits) {
  it.finished = true;
  engine_->FreeSequence(it.seq);  // the KV left in the pushed chunks
  const pb::SequenceSpec& spec = it.job->request.seq();
  pb::PrefillResponse resp;
  if (status.ok()) {
    std::string reason = "length";  // prompt-only: nothing is sampled
    if (spec.stop().max_tokens() > 0) {
      const SamplingParams sampling =
          transport::SamplingFromProto(spec.sampling());
      const StopParams stop = transport::StopFromProto(
          spec.stop(), engine_->generation_config().eos_token_ids);
      // After a migration the prompt's tail is the stream's earlier output,
      // which the penalties count as output; the position is absolute.
      const auto prompt = absl::MakeConstSpan(it.prompt);
      const size_t earlier = static_cast<size_t>(spec.generated_tokens());
      SampledToken tok = SampleToken(
          std::vector<float>(last_logits.begin(), last_logits.end()), sampling,
          prompt.first(prompt.size() - earlier), prompt.last(earlier),
          static_cast<int64_t>(prompt.size()),
          StopIdsBanned(stop, /*output_len=*/0));
      transport::ToWireToken(tok.id, tok.logprob, tok.top_logprobs,
                             resp.mutable_first_token());
      reason = StopReason(stop, tok.id, 1);
    }
    transport::ToWirePromptLogprobs(it.prompt_scores,
                                    resp.mutable_prompt_logprobs());
    resp.set_finished(!reason.empty());
    resp.set_finish_reason(reason);
    resp.set_prefill_queue_seconds(it.queue_seconds);
    resp.set_prefill_compute_seconds(
        absl::ToDoubleSeconds(absl::Now() - it.start));
    options_.metrics->compute().ObserveCompute(
        resp.prefill_compute_seconds(),
        static_cast<int64_t>(it.prompt.size()) - it.reused_tokens);
    if (it.push == nullptr) {
      // prompt-only: no push was opened
    } else if (resp.finished()) {
      it.push->Discard();  // nothing left to decode: not a failure
    } else {
      pb::KvCommit commit;
      *commit.mutable_first_token() = resp.first_token();
      commit.set_prefill_queue_seconds(resp.prefill_queue_seconds());
      commit.set_prefill_compute_seconds(resp.prefill_compute_seconds());
      it.push->Commit(std::move(commit));
    }
  } else if (it.push != nullptr) {
    it.push->Cancel();
  }
  absl::MutexLock lock(&mu_);
  it.job->response = std::move(resp);
  it.job->Finish(status);
}

grpc::Status PrefillWorker::Status(grpc::ServerContext*,
                                   const pb::WorkerStatusRequest*,
                                   pb::WorkerStatusResponse* r) {
  r->set_role("prefill");
  r->set_model_fingerprint(fingerprint_);
  {
    absl::MutexLock lock(&mu_);
    r->set_queue_depth(static_cast<int>(queue_.size()));
  }
  r->set_request_capacity(options_.max_queue);
  r->set_running(in_flight_.load());
  r->set_free_kv_blocks(free_blocks_.load());
  r->set_total_kv_blocks(total_blocks_.load());
  r->set_kv_block_size(engine_->kv_layout().block_size);
  r->set_prefill_tokens_computed(prefill_tokens_.load());
  // For the router's --mode=auto policy.
  const CostFit::Estimate cost = prefill_cost_.Get();
  r->set_prefill_tokens_per_second(cost.rate);
  r->set_prefill_overhead_seconds(cost.overhead);
  r->set_queued_prefill_tokens(queued_tokens_.load());
  r->set_kv_bytes_per_token(engine_->kv_layout().BytesPerTokenPerLayer() *
                            engine_->kv_layout().num_layers);
  r->set_num_layers(engine_->kv_layout().num_layers);
  r->set_prefix_hit_tokens(prefix_hit_tokens_.load());
  r->set_requests_rejected(rejected_.load());
  r->set_prefix_cached_blocks(prefix_cached_blocks_.load());
  r->set_kv_bytes_pushed(push_counters_.bytes.load());
  r->set_kv_pushes_ok(push_counters_.ok.load());
  r->set_kv_pushes_failed(push_counters_.failed.load());
  if (options_.ucx_stats) {
    const transport::UcxStats u = options_.ucx_stats();
    transport::FillUcxStatus(u, r);
    options_.metrics->ucx().Set(u.endpoints, u.registered_bytes, u.transfers,
                                u.endpoint_errors, u.mapped_buffers);
  }
  r->set_requests_completed(completed_.load());
  r->set_requests_cancelled(cancelled_.load());
  r->set_draining(draining_.load());
  return grpc::Status::OK;
}

grpc::Status PrefillWorker::Abort(grpc::ServerContext*,
                                  const pb::AbortRequest* request,
                                  pb::AbortResponse* response) {
  absl::MutexLock lock(&mu_);
  bool found = false;
  auto job = jobs_.find(request->request_id());
  if (job != jobs_.end()) {
    job->second->cancelled = true;
    found = true;
  }
  auto push = pushes_.find(request->request_id());
  if (push != pushes_.end()) {
    push->second->Cancel();
    found = true;
  }
  response->set_found(found);
  return grpc::Status::OK;
}

}  // namespace pdserve
