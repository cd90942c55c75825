#include "decode_worker/kv_lease_table.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/cancellation_poll.h"
#include "common/transport/kv_wire.h"
#include "common/util/logging.h"

namespace pdserve {

class KvLeaseTable::Sink : public transport::KvSink {
 public:
  Sink(KvLeaseTable* table, std::string id, uint64_t generation)
      : table_(table), id_(std::move(id)), generation_(generation) {}
  absl::Status OnChunk(const transport::KvChunkView& chunk,
                       uint64_t* xxh3) override {
    return table_->ImportChunk(id_, generation_, chunk, xxh3);
  }
  // The import hashes the bytes as it reads them; a chunk that fails the
  // comparison fails the push, whose sequence (the only blocks it wrote)
  // is freed by OnAbort.
  bool HashesChunks() const override { return true; }
  absl::Status OnCommit(const pb::KvCommit& commit, double seconds) override {
    return table_->CommitPush(id_, generation_, commit, seconds);
  }
  void OnAbort(const absl::Status& status) override {
    table_->AbortPush(id_, generation_, status);
  }
  void OnChecksumFailure() override {
    table_->metrics_->CountChecksumFailure();
  }

 private:
  KvLeaseTable* const table_;
  const std::string id_;
  const uint64_t generation_;
};

KvLeaseTable::KvLeaseTable(GenerationScheduler* scheduler, const Engine* engine,
                           absl::Duration lease,
                           metrics::DecodeMetrics* metrics)
    : scheduler_(scheduler),
      fingerprint_(engine->fingerprint()),
      layout_(engine->kv_layout()),
      lease_(lease),
      metrics_(metrics) {
  reaper_ = std::thread([this] { ReaperLoop(); });
}

KvLeaseTable::~KvLeaseTable() {
  std::vector<SeqId> to_free;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [id, e] : entries_) {
      SeqId s =
          FailLocked(e, absl::UnavailableError("decode worker shutting down"));
      if (s >= 0) to_free.push_back(s);
    }
  }
  reaper_.join();
  for (SeqId s : to_free) FreeSequence(s);
}

void KvLeaseTable::FreeSequence(SeqId seq) {
  if (seq < 0) return;
  scheduler_->WithEngine([seq](Engine& engine) { engine.FreeSequence(seq); });
}

SeqId KvLeaseTable::FailLocked(Entry& e, absl::Status status) {
  SeqId to_free = -1;
  if (e.state == State::kReceiving || e.state == State::kComplete) {
    to_free = e.seq;
    e.seq = -1;
  }
  if (e.state == State::kReceiving && e.cancel_push) e.cancel_push();
  e.cancel_push = nullptr;
  if (e.state != State::kFailed) {
    e.state = State::kFailed;
    e.status = std::move(status);
    e.settled.Signal();
  }
  e.deadline = absl::Now() + lease_;  // a tombstone the claimer can read
  return to_free;
}

absl::StatusOr<std::unique_ptr<transport::KvSink>> KvLeaseTable::Begin(
    const pb::KvHeader& header, std::function<void()> cancel) {
  const std::string& id = header.request_id();
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(id);
    if (it != entries_.end() && it->second.state != State::kAwaitingPush) {
      if (it->second.state == State::kFailed) return it->second.status;
      return absl::AlreadyExistsError(
          absl::StrCat("KV push ", id, " already exists"));
    }
  }
  const int tokens = header.num_tokens();
  const int max_tokens = std::max(0, header.seq().stop().max_tokens());
  // The prompt's blocks (the generated tokens' grow on demand in the batch).
  absl::StatusOr<SeqId> seq =
      scheduler_->CreateSequenceForImport(tokens, max_tokens);
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[id];
  if (!seq.ok()) {
    // Too large for the whole pool is OUT_OF_RANGE (the router tries a
    // larger worker, else the client gets 400); full now is
    // RESOURCE_EXHAUSTED (a retry may fit).
    const absl::Status s =
        absl::IsResourceExhausted(seq.status())
            ? absl::ResourceExhaustedError(
                  absl::StrCat("decode worker has no room for the ", tokens,
                               "-token prompt's KV: ", seq.status().message()))
            : seq.status();
    FailLocked(e, s);
    return s;
  }
  if (e.state != State::kAwaitingPush) {
    // Aborted (or a duplicate push) while blocks were reserved.
    absl::Status s = e.state == State::kFailed
                         ? e.status
                         : absl::AlreadyExistsError("duplicate KV push");
    mu_.Unlock();
    FreeSequence(*seq);
    mu_.Lock();
    return s;
  }
  e.state = State::kReceiving;
  e.seq = *seq;
  e.generation = next_generation_++;
  e.ready.spec = header.seq();
  e.deadline = absl::Now() + lease_;
  e.cancel_push = std::move(cancel);
  e.transport = transport::KvHeaderTransport(header);
  return std::make_unique<Sink>(this, id, e.generation);
}

void KvLeaseTable::Refused(const pb::KvHeader& header,
                           const absl::Status& status) {
  if (header.request_id().empty()) return;
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[header.request_id()];
  if (e.state == State::kAwaitingPush) FailLocked(e, status);
}

absl::Status KvLeaseTable::ImportChunk(const std::string& id,
                                       uint64_t generation,
                                       const transport::KvChunkView& chunk,
                                       uint64_t* xxh3) {
  absl::Status status;
  scheduler_->WithEngine([&](Engine& engine) {
    SeqId seq = -1;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(id);
      if (it == entries_.end() || it->second.generation != generation) {
        status = absl::CancelledError("KV push was aborted");
        return;
      }
      Entry& e = it->second;
      if (e.state != State::kReceiving) {
        status = e.state == State::kFailed ? e.status
                                           : absl::InternalError("bad state");
        return;
      }
      e.deadline = absl::Now() + lease_;  // progress renews the lease
      e.bytes += static_cast<int64_t>(chunk.data.size());
      seq = e.seq;
    }
    // FreeSequence of this seq also runs under WithEngine: it cannot
    // interleave with this import.
    status = engine.ImportLayerKv(seq, chunk.layer, chunk.token_begin,
                                  chunk.token_end, chunk.data, xxh3);
  });
  return status;
}

absl::Status KvLeaseTable::CommitPush(const std::string& id,
                                      uint64_t generation,
                                      const pb::KvCommit& commit,
                                      double seconds) {
  absl::Status status;
  scheduler_->WithEngine([&](Engine& engine) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.generation != generation ||
        it->second.state != State::kReceiving) {
      status = absl::CancelledError("KV push was aborted");
      return;
    }
    Entry& e = it->second;
    status = engine.SetSequenceLength(e.seq, e.ready.spec.prompt_ids_size());
    if (!status.ok()) return;
    e.state = State::kComplete;
    e.settled.Signal();
    e.cancel_push = nullptr;
    e.ready.first_token = commit.first_token();
    e.ready.kv_transfer_seconds = seconds;
    e.ready.kv_complete = absl::Now();
    metrics_->KvPushReceived(e.bytes, e.transport);
    e.ready.prefill_queue_seconds = commit.prefill_queue_seconds();
    e.ready.prefill_compute_seconds = commit.prefill_compute_seconds();
    e.deadline = absl::Now() + lease_;  // the router must claim it in time
  });
  return status;
}

void KvLeaseTable::AbortPush(const std::string& id, uint64_t generation,
                             const absl::Status& status) {
  SeqId to_free = -1;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.generation != generation) return;
    if (it->second.state == State::kReceiving) {
      it->second.cancel_push = nullptr;  // the stream is already over
      to_free = FailLocked(it->second, status);
    }
  }
  FreeSequence(to_free);
}

absl::StatusOr<ReadySequence> KvLeaseTable::Claim(
    const std::string& request_id, const std::function<bool()>& is_cancelled) {
  mu_.Lock();
  Entry& e = entries_[request_id];
  if (e.claimed) {
    mu_.Unlock();
    return absl::AlreadyExistsError(
        absl::StrCat("request ", request_id, " was already claimed"));
  }
  if (e.state == State::kAwaitingPush && e.deadline == absl::Time()) {
    e.deadline = absl::Now() + lease_;
  }
  e.claimed = true;
  CancellationPoll poll;
  while (true) {
    auto it = entries_.find(request_id);
    if (it == entries_.end()) {  // cannot happen while claimed
      mu_.Unlock();
      return absl::InternalError("claimed entry vanished");
    }
    Entry& cur = it->second;
    if (cur.state == State::kComplete) {
      ReadySequence ready = std::move(cur.ready);
      ready.seq = cur.seq;
      entries_.erase(it);
      mu_.Unlock();
      return ready;
    }
    if (cur.state == State::kFailed) {
      absl::Status s = cur.status;
      entries_.erase(it);
      mu_.Unlock();
      return s;
    }
    if (is_cancelled()) {
      // Keep a tombstone so that a push arriving later is refused.
      SeqId to_free = FailLocked(cur, absl::CancelledError("claim cancelled"));
      cur.claimed = false;
      mu_.Unlock();
      FreeSequence(to_free);
      return absl::CancelledError(
          "decode request cancelled while waiting for KV");
    }
    cur.settled.WaitWithTimeout(&mu_, poll.Interval());
  }
}

bool KvLeaseTable::Abort(const std::string& request_id) {
  SeqId to_free = -1;
  bool found = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(request_id);
    if (it != entries_.end()) {
      found = true;
      to_free =
          FailLocked(it->second, absl::CancelledError("aborted by the router"));
    } else {
      // A tombstone: a push that arrives later is refused.
      Entry& e = entries_[request_id];
      FailLocked(e, absl::CancelledError("aborted by the router"));
    }
  }
  FreeSequence(to_free);
  return found;
}

int KvLeaseTable::pending() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, e] : entries_) {
    if (e.state == State::kReceiving || e.state == State::kComplete) ++n;
  }
  return n;
}

void KvLeaseTable::ReaperLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(50));
    if (stop_) break;
    const absl::Time now = absl::Now();
    std::vector<SeqId> to_free;
    for (auto it = entries_.begin(); it != entries_.end();) {
      Entry& e = it->second;
      if (now < e.deadline) {
        ++it;
        continue;
      }
      switch (e.state) {
        case State::kReceiving:
        case State::kComplete: {
          lease_expiries_.fetch_add(1);
          metrics_->CountLeaseExpiry();
          PDSERVE_LOG_WARNING("KV lease of %s expired (%s)", it->first,
                              e.state == State::kReceiving ? "push incomplete"
                                                           : "never claimed");
          to_free.push_back(FailLocked(
              e, absl::UnavailableError(absl::StrCat(
                     "KV for request ", it->first,
                     e.state == State::kReceiving
                         ? " did not arrive completely within the lease ("
                         : " was not claimed within the lease (",
                     absl::FormatDuration(lease_), ")"))));
          break;
        }
        case State::kAwaitingPush:
          if (e.claimed) {
            FailLocked(e, absl::UnavailableError(
                              absl::StrCat("no KV push arrived for request ",
                                           it->first, " within the lease (",
                                           absl::FormatDuration(lease_), ")")));
          }
          break;
        case State::kFailed:
          break;
      }
      if (!e.claimed && e.state == State::kFailed && now >= e.deadline) {
        it = entries_.erase(it);
      } else if (!e.claimed && e.state == State::kAwaitingPush) {
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    if (!to_free.empty()) {
      mu_.Unlock();
      for (SeqId s : to_free) FreeSequence(s);
      mu_.Lock();
    }
  }
}

}  // namespace pdserve
