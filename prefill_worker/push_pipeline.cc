#include "prefill_worker/push_pipeline.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/util/logging.h"

namespace pdserve {

PushPipeline::PushPipeline(transport::KvSender* sender, std::string target,
                           pb::KvHeader header, absl::Time deadline,
                           PushCounters* counters)
    : sender_(sender),
      target_(std::move(target)),
      header_(std::move(header)),
      deadline_(deadline),
      counters_(counters) {
  thread_ = std::thread([this] { Run(); });
}

PushPipeline::~PushPipeline() {
  {
    absl::MutexLock lock(&mu_);
    if (!done_ && !commit_.has_value()) cancelled_ = true;
    if (cancelled_ && stream_ != nullptr) stream_->Cancel();
  }
  thread_.join();
}

void PushPipeline::Enqueue(pb::KvChunk chunk,
                           std::unique_ptr<transport::KvChunkBuffer> bytes) {
  Queued queued{std::move(chunk), std::move(bytes)};
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queued_bytes_ < kMaxQueuedBytes || cancelled_ || failed_;
  };
  mu_.Await(absl::Condition(&room));
  if (cancelled_ || failed_) return;
  queued_bytes_ += queued.size();
  chunks_.push_back(std::move(queued));
}

void PushPipeline::Commit(pb::KvCommit commit) {
  absl::MutexLock lock(&mu_);
  commit_ = std::move(commit);
}

void PushPipeline::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  chunks_.clear();
  queued_bytes_ = 0;
  if (stream_ != nullptr) stream_->Cancel();
}

void PushPipeline::Discard() {
  {
    absl::MutexLock lock(&mu_);
    discarded_ = true;
  }
  Cancel();
}

bool PushPipeline::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void PushPipeline::Run() {
  // P's view of the push: first byte (the header) sent -> last ack received.
  const absl::Time start = absl::Now();
  auto opened = sender_->Open(target_, header_, deadline_);
  absl::Status status = opened.status();
  {
    absl::MutexLock lock(&mu_);
    if (opened.ok()) {
      stream_ = *std::move(opened);
      if (cancelled_) stream_->Cancel();
    } else {
      failed_ = true;
    }
  }
  while (status.ok()) {
    std::optional<Queued> chunk;
    std::optional<pb::KvCommit> commit;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !chunks_.empty() || commit_.has_value() || cancelled_;
      };
      mu_.Await(absl::Condition(&ready));
      if (cancelled_) {
        status = absl::CancelledError("push cancelled");
        break;
      }
      if (!chunks_.empty()) {
        chunk = std::move(chunks_.front());
        chunks_.pop_front();
        queued_bytes_ -= chunk->size();
      } else {
        commit = *commit_;
      }
    }
    if (chunk.has_value()) {
      status = chunk->bytes != nullptr
                   ? stream_->SendBuffer(std::move(chunk->chunk),
                                         std::move(chunk->bytes))
                   : stream_->Send(std::move(chunk->chunk));
      continue;
    }
    auto result = stream_->Commit(*commit);
    status = result.status();
    if (result.ok()) {
      counters_->bytes.fetch_add(result->bytes);
      counters_->ok.fetch_add(1);
      if (counters_->metrics != nullptr) {
        counters_->metrics->PushSucceeded(
            result->bytes, absl::ToDoubleSeconds(absl::Now() - start),
            result->transport);
      }
    }
    break;
  }
  bool discarded;
  {
    absl::MutexLock lock(&mu_);
    discarded = discarded_;
  }
  if (!status.ok() && !discarded && counters_->metrics != nullptr) {
    counters_->metrics->PushFailed(status.code());
  }
  if (!status.ok()) {
    counters_->failed.fetch_add(1);
    if (!absl::IsCancelled(status)) {
      PDSERVE_LOG_WARNING("KV push of %s to %s failed: %s",
                          header_.request_id(), target_, status.ToString());
    }
  }
  absl::MutexLock lock(&mu_);
  failed_ = !status.ok();
  chunks_.clear();
  queued_bytes_ = 0;
  done_ = true;
  stream_.reset();
}

}  // namespace pdserve
