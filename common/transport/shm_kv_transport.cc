#include "common/transport/shm_kv_transport.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/transport/kv_wire.h"
#include "common/util/logging.h"
#include "grpcpp/client_context.h"

namespace pdserve::transport {
namespace {

// One push through shared memory. Send/Commit run on one thread; Cancel may
// come from any thread. Until D has opened the segment nothing reaches a
// sink, so a refusal of the segment (auto mode) replays the chunks written
// so far from the segment over a plain gRPC stream, which then carries the
// rest of the push.
class ShmKvPushStream : public KvPushStream {
 public:
  ShmKvPushStream(ShmKvSender* sender, std::string target, pb::KvHeader header,
                  absl::Time deadline, std::unique_ptr<ShmSegment> segment)
      : sender_(sender),
        target_(std::move(target)),
        header_(std::move(header)),
        deadline_(deadline),
        faults_(sender->grpc()->faults()),
        segment_(std::move(segment)),
        call_(sender->grpc()->ChannelFor(target_), deadline) {}

  absl::Status Start() {
    pb::KvPushMessage msg;
    *msg.mutable_header() = header_;
    msg.mutable_header()->mutable_shm()->set_name(segment_->name());
    msg.mutable_header()->mutable_shm()->set_size(segment_->size());
    if (faults_.unlink_shm_segment) segment_->Unlink();  // test-only
    return Check(call_.Write(msg));
  }

  absl::Status Send(pb::KvChunk chunk) override {
    if (KvPushStream* f = fallback()) return f->Send(std::move(chunk));
    const int index = chunks_sent_++;
    if (faults_.stop_after_chunks >= 0 && index >= faults_.stop_after_chunks) {
      stalled_ = true;  // test-only: the push never completes
      return absl::OkStatus();
    }
    const int64_t n = static_cast<int64_t>(chunk.data().size());
    if (n > segment_->size() - offset_) {
      return Check(absl::InternalError(absl::StrCat(
          "KV chunk of ", n, " bytes overflows the shared-memory segment (",
          offset_, " of ", segment_->size(), " bytes used)")));
    }
    char* dst = segment_->mutable_data() + offset_;
    std::memcpy(dst, chunk.data().data(), static_cast<size_t>(n));
    if (index == faults_.corrupt_chunk && n > 0) dst[n / 2] ^= 0x5a;
    pb::KvChunkRef desc;
    desc.set_layer(chunk.layer());
    desc.set_token_begin(chunk.token_begin());
    desc.set_token_end(chunk.token_end());
    desc.set_offset(offset_);
    desc.set_length(n);
    desc.set_xxh3(chunk.xxh3());
    offset_ += n;
    sent_.push_back(desc);
    pb::KvPushMessage msg;
    *msg.mutable_chunk_ref() = std::move(desc);
    return Check(call_.Write(msg));
  }

  absl::StatusOr<KvPushResult> Commit(const pb::KvCommit& commit) override {
    if (KvPushStream* f = fallback()) return f->Commit(commit);
    if (stalled_) return Check(call_.FinishWithoutCommit());
    pb::KvPushMessage msg;
    *msg.mutable_commit() = commit;
    auto ack = call_.Finish(msg);
    if (!ack.ok()) {
      absl::Status s = Check(ack.status());
      if (!s.ok()) return s;
      return fallback()->Commit(commit);  // refused segment: went to gRPC
    }
    // D has unmapped the segment before acknowledging: reusable.
    std::unique_ptr<ShmSegment> done;
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) done = std::move(segment_);
    }
    if (done != nullptr) sender_->ReturnSegment(std::move(done));
    return KvPushResult{ack->bytes_received(), ack->transfer_seconds(), "shm"};
  }

  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    call_.Cancel();
    if (fallback_ != nullptr) fallback_->Cancel();
    if (segment_ != nullptr) segment_->Unlink();
  }

 private:
  KvPushStream* fallback() {
    absl::MutexLock lock(&mu_);
    return fallback_.get();
  }

  // OK passes. A refused segment in auto mode switches to gRPC (OK when that
  // worked); any other error fails the push and forgets the target's answer.
  absl::Status Check(absl::Status s) {
    if (s.ok()) return s;
    segment_->Unlink();
    if (!absl::IsCancelled(s)) sender_->Forget(target_);  // ask D again
    if (!call_.transport_unusable() ||
        sender_->mode() != KvTransportMode::kAuto || stalled_) {
      return s;
    }
    PDSERVE_LOG_WARNING(
        "KV push %s: %s cannot open the shared-memory segment (%s); "
        "falling back to gRPC",
        header_.request_id(), target_, s.ToString());
    auto opened = sender_->grpc()->Open(target_, header_, deadline_);
    if (!opened.ok()) return opened.status();
    for (size_t i = 0; i < sent_.size(); ++i) {
      pb::KvChunk chunk;
      chunk.set_layer(sent_[i].layer());
      chunk.set_token_begin(sent_[i].token_begin());
      chunk.set_token_end(sent_[i].token_end());
      chunk.set_data(segment_->data() + sent_[i].offset(),
                     static_cast<size_t>(sent_[i].length()));
      chunk.set_xxh3(sent_[i].xxh3());
      if (static_cast<int>(i) == faults_.corrupt_chunk &&
          !chunk.data().empty()) {
        // Undo this stream's test-only corruption: the gRPC stream applies
        // its own to the same chunk.
        (*chunk.mutable_data())[chunk.data().size() / 2] ^= 0x5a;
      }
      if (absl::Status st = (*opened)->Send(std::move(chunk)); !st.ok()) {
        return st;
      }
    }
    absl::MutexLock lock(&mu_);
    fallback_ = *std::move(opened);
    if (cancelled_) fallback_->Cancel();
    return absl::OkStatus();
  }

  ShmKvSender* const sender_;
  const std::string target_;
  const pb::KvHeader header_;
  const absl::Time deadline_;
  const KvFaultInjection faults_;
  // Set until a successful commit hands it back to the sender's pool (under
  // mu_); read without the lock by the driving thread, which alone moves it.
  std::unique_ptr<ShmSegment> segment_;
  KvPushCall call_;
  std::vector<pb::KvChunkRef> sent_;  // descriptors, for a fallback replay
  int64_t offset_ = 0;
  int chunks_sent_ = 0;
  bool stalled_ = false;
  absl::Mutex mu_;
  std::unique_ptr<KvPushStream> fallback_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

namespace {

// A push's segment, mapped read-only for the push.
class ShmChunkSource : public KvChunkSource {
 public:
  explicit ShmChunkSource(std::unique_ptr<ShmSegment> segment)
      : segment_(std::move(segment)) {}
  absl::StatusOr<KvChunkView> Fetch(const pb::KvChunkRef& ref,
                                    const std::function<bool()>&) override {
    return ChunkFromShm(*segment_, ref);
  }

 private:
  std::unique_ptr<ShmSegment> segment_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvChunkSource>> OpenShmChunkSource(
    const pb::KvShmSegment& shm, int64_t expected_bytes) {
  if (shm.size() < expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV header: shared-memory segment of ", shm.size(),
                     " bytes, the push needs ", expected_bytes));
  }
  auto segment = ShmSegment::OpenReadOnly(shm.name(), shm.size());
  if (!segment.ok()) return segment.status();
  return std::make_unique<ShmChunkSource>(*std::move(segment));
}

absl::StatusOr<KvChunkView> ChunkFromShm(const ShmSegment& segment,
                                         const pb::KvChunkRef& desc) {
  if (desc.offset() < 0 || desc.length() < 0 ||
      desc.offset() > segment.size() ||
      desc.length() > segment.size() - desc.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunk: bytes [", desc.offset(), ", +", desc.length(),
        ") outside the shared-memory segment of ", segment.size(), " bytes"));
  }
  return KvChunkView{desc.layer(), desc.token_begin(), desc.token_end(),
                     absl::string_view(segment.data() + desc.offset(),
                                       static_cast<size_t>(desc.length())),
                     desc.xxh3()};
}

ShmKvSender::ShmKvSender(GrpcKvSender* grpc, KvTransportMode mode)
    : grpc_(grpc), mode_(mode) {
  if (mode_ != KvTransportMode::kGrpc) {
    SweepStaleShmSegments(absl::Seconds(10));  // what a kill -9 left behind
    reaper_ = std::thread([this] { ReapLoop(); });
  }
}

ShmKvSender::~ShmKvSender() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
}

void ShmKvSender::ReapLoop() {
  absl::Time last_sweep = absl::Now();
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(500));
    const absl::Time now = absl::Now();
    for (auto it = pool_.begin(); it != pool_.end();) {
      it = stop_ || now - it->since >= kPoolIdle ? pool_.erase(it) : it + 1;
    }
    if (!stop_ && now - last_sweep >= kSweepEvery) {
      // Segments of processes killed with -9 (their pools, their probes).
      last_sweep = now;
      mu_.Unlock();
      SweepStaleShmSegments(kSweepEvery);
      mu_.Lock();
    }
  }
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmKvSender::TakeSegment(
    int64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    auto best = pool_.end();
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      const int64_t size = it->segment->size();
      if (size >= bytes && size / 2 <= std::max(bytes, kSegmentRound) &&
          (best == pool_.end() || size < best->segment->size())) {
        best = it;
      }
    }
    if (best != pool_.end()) {
      std::unique_ptr<ShmSegment> s = std::move(best->segment);
      pool_.erase(best);
      return s;
    }
  }
  return ShmSegment::Create(kShmKvPrefix, (bytes + kSegmentRound - 1) /
                                              kSegmentRound * kSegmentRound);
}

void ShmKvSender::ReturnSegment(std::unique_ptr<ShmSegment> segment) {
  if (segment->unlinked()) return;
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  pool_.push_back(Pooled{std::move(segment), absl::Now()});
  if (static_cast<int>(pool_.size()) > kMaxPooled) {
    pool_.erase(pool_.begin());  // the oldest
  }
}

int ShmKvSender::pooled_segments() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pool_.size());
}

absl::StatusOr<bool> ShmKvSender::ShmUsable(const std::string& target,
                                            absl::Time deadline) {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    auto it = probed_.find(target);
    if (it != probed_.end() &&
        (it->second.usable || now - it->second.at < kNegativeTtl)) {
      return it->second.usable;
    }
  }
  auto response = grpc_->Describe(target, deadline);
  if (!response.ok()) return response.status();  // not cached: ask again
  const bool usable =
      !response->shm_probe_name().empty() &&
      ShmProbeMatches(response->shm_probe_name(), response->shm_probe_nonce());
  absl::MutexLock lock(&mu_);
  probed_[target] = Probed{usable, now};
  return usable;
}

void ShmKvSender::Forget(const std::string& target) {
  absl::MutexLock lock(&mu_);
  probed_.erase(target);
}

absl::StatusOr<std::unique_ptr<KvPushStream>> ShmKvSender::Open(
    const std::string& target, const pb::KvHeader& header,
    absl::Time deadline) {
  if (mode_ == KvTransportMode::kGrpc) {
    return grpc_->Open(target, header, deadline);
  }
  const bool must = mode_ == KvTransportMode::kShm;
  auto usable = ShmUsable(target, deadline);
  if (!usable.ok() || !*usable) {
    if (!must) return grpc_->Open(target, header, deadline);
    return absl::FailedPreconditionError(absl::StrCat(
        "--kv_transport=shm: decode worker ", target,
        " cannot share memory with this prefill worker (other host, "
        "/dev/shm or user",
        usable.ok() ? "" : absl::StrCat("; ", usable.status().ToString()),
        "); use --kv_transport=auto"));
  }
  auto layout = LayoutFromProto(header.layout());
  if (!layout.ok()) return layout.status();
  const int64_t bytes = layout->BytesPerTokenPerLayer() * header.num_tokens() *
                        layout->num_layers;
  auto segment = TakeSegment(bytes);
  if (!segment.ok()) {
    if (must) return segment.status();
    PDSERVE_LOG_WARNING("KV push %s over gRPC: %s", header.request_id(),
                        segment.status().ToString());
    return grpc_->Open(target, header, deadline);
  }
  auto stream = std::make_unique<ShmKvPushStream>(
      this, target, header, deadline, *std::move(segment));
  absl::Status s = stream->Start();
  if (!s.ok()) return s;
  return stream;
}

}  // namespace pdserve::transport
