#include "prefill_worker/prefill_worker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/sampling/sampler.h"
#include "common/transport/kv_wire.h"
#include "common/transport/sequence_spec.h"
#include "common/util/logging.h"

namespace pdserve {

// One Prefill call. Written by the compute thread, read by the handler once
// `done` is set (under PrefillWorker::mu_).
struct PrefillWorker::Job {
  pb::PrefillRequest request;
  absl::Time arrival;
  bool cancelled = false;
  bool done = false;
  absl::Status status;
  pb::PrefillResponse response;
};

PrefillWorker::PrefillWorker(const PrefillWorkerOptions& options,
                             transport::KvSender* sender)
    : options_(options), sender_(sender) {}

absl::StatusOr<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(
    const PrefillWorkerOptions& options, transport::KvSender* sender) {
  if (options.metrics == nullptr) {
    return absl::InvalidArgumentError("PrefillWorkerOptions.metrics is null");
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
  compute_.join();
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
  if (spec.prompt_ids_size() + spec.stop().max_tokens() >
      engine_->config().max_position_embeddings) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("prompt + max_tokens beyond context"));
  }
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
  options_.metrics->SetQueueDepth(static_cast<int64_t>(queue_.size()));
  while (!job->done) {
    mu_.AwaitWithTimeout(absl::Condition(&job->done), absl::Milliseconds(20));
    if (!job->done && context->IsCancelled()) {
      job->cancelled = true;
      auto it = pushes_.find(spec.request_id());
      if (it != pushes_.end()) it->second->Cancel();
      break;
    }
  }
  jobs_.erase(spec.request_id());
  in_flight_.fetch_sub(1);
  if (job->cancelled && !job->done) {
    cancelled_.fetch_add(1);
    return ToGrpcStatus(absl::CancelledError("prefill cancelled"));
  }
  if (!job->status.ok()) return ToGrpcStatus(job->status);
  *response = job->response;
  completed_.fetch_add(1);
  return grpc::Status::OK;
}

void PrefillWorker::ComputeLoop() {
  while (true) {
    std::vector<std::shared_ptr<Job>> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200));
      ReapPushes();
      if (stop_) {
        for (auto& job : queue_) {
          job->status = absl::UnavailableError("prefill worker shutting down");
          job->done = true;
        }
        queue_.clear();
        return;
      }
      // Every queued prompt that fits the token budget (at least one).
      int tokens = 0;
      while (!queue_.empty()) {
        auto& job = queue_.front();
        if (job->cancelled) {
          queue_.pop_front();
          continue;
        }
        const int n = job->request.seq().prompt_ids_size();
        if (!batch.empty() && tokens + n > max_batch_tokens_) break;
        tokens += n;
        batch.push_back(std::move(job));
        queue_.pop_front();
      }
      options_.metrics->SetQueueDepth(static_cast<int64_t>(queue_.size()));
    }
    if (!batch.empty()) RunBatch(batch);
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

void PrefillWorker::RunBatch(std::vector<std::shared_ptr<Job>>& batch) {
  if (options_.testonly_prefill_delay > absl::ZeroDuration()) {
    absl::SleepFor(options_.testonly_prefill_delay);
  }
  const absl::Time start = absl::Now();
  struct Item {
    std::shared_ptr<Job> job;
    SeqId seq = -1;
    std::vector<int32_t> prompt;
    int done_tokens = 0;
    int reused_tokens = 0;  // from the prefix cache
    PushPipeline* push = nullptr;
    double queue_seconds = 0;
  };
  std::vector<Item> items;
  for (auto& job : batch) {
    Item it;
    it.job = job;
    const pb::SequenceSpec& spec = job->request.seq();
    it.prompt.assign(spec.prompt_ids().begin(), spec.prompt_ids().end());
    it.queue_seconds = absl::ToDoubleSeconds(start - job->arrival);
    absl::StatusOr<SeqId> seq = engine_->CreateSequence();
    absl::Status s = seq.status();
    int reused = 0;
    if (seq.ok()) {
      // Cached full blocks of an earlier prompt with the same prefix: only
      // the rest is computed (bit-identical KV and logits).
      absl::StatusOr<int> attached =
          engine_->AttachCachedPrefix(*seq, it.prompt);
      s = attached.status();
      if (attached.ok()) {
        reused = *attached;
        s = engine_->Reserve(*seq, static_cast<int>(it.prompt.size()));
      }
      if (!s.ok()) engine_->FreeSequence(*seq);
    }
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      job->status = absl::ResourceExhaustedError(
          absl::StrCat("prefill worker KV pool full: ", s.message()));
      job->done = true;
      continue;
    }
    it.seq = *seq;
    it.done_tokens = reused;
    it.reused_tokens = reused;
    prefix_hit_tokens_.fetch_add(reused);
    options_.metrics->compute().ObservePrefixLookup(
        static_cast<int64_t>(it.prompt.size()), reused);
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
      EnqueueKvChunks(it.seq, layer, 0, reused, it.push);
    }
    items.push_back(std::move(it));
  }
  std::vector<float> logits;
  std::vector<std::vector<float>> last_logits(items.size());
  absl::Status status;
  // Chunks of at most max_batch_tokens_ tokens over all items.
  while (status.ok()) {
    std::vector<Engine::ForwardItem> fwd;
    std::vector<std::pair<size_t, std::pair<int, int>>> ranges;  // item, [b, e)
    int budget = max_batch_tokens_;
    for (size_t i = 0; i < items.size() && budget > 0; ++i) {
      Item& it = items[i];
      const int remaining = static_cast<int>(it.prompt.size()) - it.done_tokens;
      if (remaining <= 0) continue;
      const int n = std::min(remaining, budget);
      budget -= n;
      const int b = it.done_tokens;
      Engine::ForwardItem f;
      f.seq = it.seq;
      f.tokens = absl::MakeConstSpan(it.prompt).subspan(b, n);
      f.want_logits = (b + n == static_cast<int>(it.prompt.size()));
      fwd.push_back(f);
      ranges.push_back({i, {b, b + n}});
    }
    if (fwd.empty()) break;
    int forward_tokens = 0;
    for (const auto& f : fwd)
      forward_tokens += static_cast<int>(f.tokens.size());
    options_.metrics->ObserveBatch(static_cast<int64_t>(fwd.size()),
                                   forward_tokens);
    ExportKvPool();
    auto on_layer_done = [&](int layer) {
      for (const auto& [i, range] : ranges) {
        EnqueueKvChunks(items[i].seq, layer, range.first, range.second,
                        items[i].push);
      }
    };
    status = engine_->Forward(fwd, &logits, on_layer_done);
    if (!status.ok()) break;
    const int vocab = engine_->config().vocab_size;
    for (size_t k = 0; k < ranges.size(); ++k) {
      Item& it = items[ranges[k].first];
      it.done_tokens = ranges[k].second.second;
      prefill_tokens_.fetch_add(ranges[k].second.second -
                                ranges[k].second.first);
      if (fwd[k].want_logits) {
        last_logits[ranges[k].first].assign(logits.begin() + k * vocab,
                                            logits.begin() + (k + 1) * vocab);
      }
    }
  }
  const std::vector<int32_t>& default_eos =
      engine_->generation_config().eos_token_ids;
  for (size_t i = 0; i < items.size(); ++i) {
    Item& it = items[i];
    engine_->FreeSequence(it.seq);  // the KV left in the pushed chunks
    const pb::SequenceSpec& spec = it.job->request.seq();
    pb::PrefillResponse resp;
    if (status.ok()) {
      const SamplingParams sampling =
          transport::SamplingFromProto(spec.sampling());
      const StopParams stop =
          transport::StopFromProto(spec.stop(), default_eos);
      SampledToken tok = SampleToken(last_logits[i], sampling, it.prompt, {},
                                     static_cast<int64_t>(it.prompt.size()));
      transport::ToWireToken(tok.id, tok.logprob, tok.top_logprobs,
                             resp.mutable_first_token());
      const std::string reason = StopReason(stop, tok.id, 1);
      resp.set_finished(!reason.empty());
      resp.set_finish_reason(reason);
      resp.set_prefill_queue_seconds(it.queue_seconds);
      resp.set_prefill_compute_seconds(
          absl::ToDoubleSeconds(absl::Now() - start));
      options_.metrics->compute().ObserveCompute(
          resp.prefill_compute_seconds(),
          static_cast<int64_t>(it.prompt.size()) - it.reused_tokens);
      if (resp.finished()) {
        it.push->Discard();  // nothing left to decode: not a failure
      } else {
        pb::KvCommit commit;
        *commit.mutable_first_token() = resp.first_token();
        commit.set_prefill_queue_seconds(resp.prefill_queue_seconds());
        commit.set_prefill_compute_seconds(resp.prefill_compute_seconds());
        it.push->Commit(std::move(commit));
      }
    } else {
      it.push->Cancel();
    }
    absl::MutexLock lock(&mu_);
    it.job->status = status;
    it.job->response = std::move(resp);
    it.job->done = true;
  }
  free_blocks_ = engine_->free_blocks();
  total_blocks_ = engine_->total_blocks();
  prefix_cached_blocks_ = engine_->stats().prefix.cached_blocks;
  ExportKvPool();
}

void PrefillWorker::EnqueueKvChunks(SeqId seq, int layer, int begin, int end,
                                    PushPipeline* push) {
  for (auto [b, e] :
       transport::ChunkTokenRanges(begin, end, layout_.BytesPerTokenPerLayer(),
                                   transport::kKvChunkTargetBytes)) {
    pb::KvChunk chunk;
    chunk.set_layer(layer);
    chunk.set_token_begin(b);
    chunk.set_token_end(e);
    absl::Status s =
        engine_->ExportLayerKv(seq, layer, b, e, chunk.mutable_data());
    if (!s.ok()) {
      push->Cancel();
      return;
    }
    transport::SealChunk(&chunk);
    push->Enqueue(std::move(chunk));
  }
}

void PrefillWorker::ExportKvPool() {
  const int64_t total = engine_->total_blocks();
  options_.metrics->kv_pool().Set(total - engine_->free_blocks(), total);
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
  r->set_running(in_flight_.load());
  r->set_free_kv_blocks(free_blocks_.load());
  r->set_total_kv_blocks(total_blocks_.load());
  r->set_prefill_tokens_computed(prefill_tokens_.load());
  r->set_prefix_hit_tokens(prefix_hit_tokens_.load());
  r->set_requests_rejected(rejected_.load());
  r->set_prefix_cached_blocks(prefix_cached_blocks_.load());
  r->set_kv_bytes_pushed(push_counters_.bytes.load());
  r->set_kv_pushes_ok(push_counters_.ok.load());
  r->set_kv_pushes_failed(push_counters_.failed.load());
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
