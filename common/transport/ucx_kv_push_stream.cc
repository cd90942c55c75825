#include "common/transport/ucx_kv_push_stream.h"

#include <sys/random.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_wire.h"
#include "common/transport/ucx_in_place_ack.h"
#include "common/transport/ucx_kv_receiver.h"
#include "common/util/logging.h"

namespace pdserve::transport {
namespace {

// A random tag prefix: the low kChunkBits bits are the chunk index, the
// top two bits are clear (in_place_ack::ValidTag).
uint64_t RandomTagPrefix() {
  constexpr uint64_t kPrefixBits =
      ~UcxKvReceiver::kChunkMask & (in_place_ack::kAnnouncedBit - 1);
  uint64_t v = 0;
  while ((v & kPrefixBits) == 0) {
    if (getrandom(&v, sizeof(v), 0) != sizeof(v)) v = 0;
  }
  return v & kPrefixBits;
}

// One push over UCX. Send/Commit run on one thread; Cancel may come from any
// thread. Each chunk is announced on the push stream (KvChunkRef with its
// tag), then left in place (D maps its buffer and acknowledges it) or sent
// as a tagged message that D receives into its landing buffer: from its
// chunk buffer (SendBuffer), or from the next slot of the ring it was
// copied into (Send). A ring slot is reused once its send completed, i.e.
// once D has the bytes: at most kSlots sends are outstanding (chunks left in
// place: at most the sender's in_place_unacked(), 2 by default), and the
// ring, registered once and pooled, stays warm in the caches and page tables
// however long the prompt.
class UcxKvPushStream : public KvPushStream {
 public:
  // How long a failed push waits for its sends (D discards what it no
  // longer wants) before closing the endpoint: the peer is then gone.
  static constexpr absl::Duration kSendGrace = absl::Seconds(5);

  UcxKvPushStream(UcxKvSender* sender, std::string target, pb::KvHeader header,
                  absl::Time deadline, int64_t slot_bytes,
                  std::unique_ptr<UcxRegion> ring,
                  std::unique_ptr<UcxConnection> connection, bool in_place)
      : sender_(sender),
        target_(std::move(target)),
        header_(std::move(header)),
        deadline_(deadline),
        faults_(sender->grpc()->faults()),
        tag_prefix_(RandomTagPrefix()),
        slot_bytes_(slot_bytes),
        ring_(std::move(ring)),
        connection_(std::move(connection)),
        call_(sender->grpc()->ChannelFor(target_), deadline),
        in_place_(in_place) {
    sender_->PushBegan();
  }

  ~UcxKvPushStream() override {
    // A push that did not commit: D may be gone. That holds for a cancelled
    // push too, since the router cancels P's push when D's leg broke, and
    // that cancel can arrive before P's own stream breaks. The next push to
    // a live D connects afresh (one wire-up); a dead D's endpoint does not
    // linger until the idle reaper.
    if (!committed_) {
      connection_->CloseWhenUnused();
      call_.Cancel();  // D stops taking the push's chunks now
    }
    // Chunks left in place that D did not acknowledge: revoked, unless D
    // is reading one now (claimed), which is reused only once D is done.
    for (InPlaceChunk& c : in_place_chunks_) {
      if (c.Acked()) {
        c.buffer->Release(true);
      } else if (in_place_ack::Revoke(c.buffer->ack_word(), c.tag)) {
        c.buffer->ReleaseRevoked();
      } else {
        c.buffer->ReleaseWhileRead(c.tag);
      }
    }
    in_place_chunks_.clear();
    if (!SendsDone(kSendGrace)) {
      PDSERVE_LOG_WARNING(
          "KV push %s: %d UCX sends to %s still pending after %s; closing "
          "the endpoint (decode worker gone?)",
          header_.request_id(), static_cast<int>(sends_.size()), target_,
          absl::FormatDuration(kSendGrace));
      sender_->worker()->Close(*connection_);
      if (!SendsDone(absl::Seconds(2))) {
        // UCX 1.13 does not end a rendezvous with a dead peer over shared
        // memory even on a closed endpoint; nobody reads the ring now.
        for (PendingSend& p : sends_) {
          p.op.Abandon();
          if (p.buffer != nullptr) p.buffer->Release(false);
        }
        sends_.clear();
      }
    }
    connection_.reset();
    if (ring_ != nullptr) sender_->ReturnRegion(std::move(ring_), false);
    sender_->PushEnded();
  }

  absl::Status Start() {
    pb::KvPushMessage msg;
    *msg.mutable_header() = header_;
    pb::KvUcxSource* src = msg.mutable_header()->mutable_ucx();
    src->set_tag_prefix(tag_prefix_);
    src->set_memory_type(std::string(UcxMemoryTypeName(ring_->memory_type())));
    src->set_worker_address(sender_->worker()->address());
    return Fail(call_.Write(msg));
  }

  absl::Status Send(pb::KvChunk chunk) override {
    return Post(chunk, static_cast<int64_t>(chunk.data().size()), nullptr);
  }

  // A buffer from this sender is sent in place; any other becomes the
  // chunk's data (copied into the ring).
  absl::Status SendBuffer(pb::KvChunk chunk,
                          std::unique_ptr<KvChunkBuffer> bytes) override {
    auto* own = dynamic_cast<UcxChunkBuffer*>(bytes.get());
    if (own == nullptr || own->sender() != sender_) {
      return KvPushStream::SendBuffer(std::move(chunk), std::move(bytes));
    }
    bytes.release();
    std::unique_ptr<UcxChunkBuffer> buffer(own);
    const int64_t n = buffer->size();
    return Post(chunk, n, std::move(buffer));
  }

 private:
  // A posted send and, for a chunk sent in place, its buffer.
  struct PendingSend {
    UcxSendOp op;
    std::unique_ptr<UcxChunkBuffer> buffer;
  };

  // A chunk left in its buffer for D to map (KvChunkRef.ucx_rkey), until D
  // releases it in the buffer's ack word (ucx_in_place_ack.h).
  struct InPlaceChunk {
    std::unique_ptr<UcxChunkBuffer> buffer;
    uint64_t tag;
    bool Acked() const {
      return in_place_ack::Released(buffer->ack_word(), tag);
    }
    // Sleeps until D may have released the chunk, at most `timeout` (D
    // wakes the futex on release: no polling).
    void AwaitAck(absl::Duration timeout) const {
      const uint64_t seen =
          __atomic_load_n(buffer->ack_word(), __ATOMIC_ACQUIRE);
      if (seen != tag) {
        in_place_ack::AwaitChange(buffer->ack_word(), seen, timeout);
      }
    }
  };

  // Waits until fewer than in_place_unacked() chunks are in place
  // unacknowledged (keeping P one chunk ahead of D's import, in cache) for
  // at most kInPlaceSoftWait without an acknowledgement, then until fewer
  // than kSlots are: a decode worker that stopped reading (a failed push)
  // does not stall P before the stream can tell it so.
  absl::Status MakeRoomInPlace() {
    auto pop_acked = [this] {
      bool popped = false;
      while (!in_place_chunks_.empty() && in_place_chunks_.front().Acked()) {
        in_place_chunks_.front().buffer->Release(true);
        in_place_chunks_.pop_front();
        popped = true;
      }
      return popped;
    };
    pop_acked();
    const int soft_limit = std::max(2, sender_->in_place_unacked());
    absl::Time soft_until = absl::Now() + kInPlaceSoftWait;
    while (static_cast<int>(in_place_chunks_.size()) >= soft_limit &&
           absl::Now() < soft_until) {
      if (pop_acked()) {
        soft_until = absl::Now() + kInPlaceSoftWait;
        continue;
      }
      in_place_chunks_.front().AwaitAck(soft_until - absl::Now());
    }
    absl::Time check = absl::Now() + absl::Milliseconds(100);
    while (static_cast<int>(in_place_chunks_.size()) >= UcxKvSender::kSlots) {
      if (pop_acked()) continue;
      in_place_chunks_.front().AwaitAck(check - absl::Now());
      if (absl::Now() >= check) {
        if (Cancelled() || absl::Now() > deadline_) {
          return absl::DeadlineExceededError(
              "KV chunk in place not acknowledged by the decode worker");
        }
        check = absl::Now() + absl::Milliseconds(100);
      }
    }
    return absl::OkStatus();
  }
  static constexpr absl::Duration kInPlaceSoftWait = absl::Milliseconds(20);

  // Ends the oldest pending send, which is done: its buffer goes back to
  // the pool (quarantined unless the send succeeded).
  absl::Status PopSend() {
    PendingSend& p = sends_.front();
    absl::Status s = p.op.status();
    if (p.buffer != nullptr) p.buffer->Release(s.ok());
    sends_.pop_front();
    return s;
  }

  // Sends `n` bytes: `buffer`'s in place, else chunk.data() copied into
  // the next ring slot.
  absl::Status Post(const pb::KvChunk& chunk, int64_t n,
                    std::unique_ptr<UcxChunkBuffer> buffer) {
    if (!error_.ok()) return error_;
    const int index = chunks_sent_++;
    if (faults_.stop_after_chunks >= 0 && index >= faults_.stop_after_chunks) {
      stalled_ = true;  // test-only: the push never completes
      return absl::OkStatus();
    }
    if ((buffer == nullptr && n > slot_bytes_) ||
        index > static_cast<int>(UcxKvReceiver::kChunkMask)) {
      return Fail(absl::InternalError(
          absl::StrCat("KV chunk ", index, " of ", n,
                       " bytes does not fit a UCX slot of ", slot_bytes_)));
    }
    // At most kSlots sends in flight: a ring slot's previous chunk (kSlots
    // back) must have reached D.
    while (static_cast<int>(sends_.size()) >= UcxKvSender::kSlots) {
      if (!sends_.front().op.Wait(absl::Milliseconds(100))) {
        if (Cancelled() || absl::Now() > deadline_) {
          return Fail(absl::DeadlineExceededError(
              "UCX send not received by the decode worker"));
        }
        continue;
      }
      if (absl::Status s = PopSend(); !s.ok()) return Fail(s);
    }
    if (buffer != nullptr && in_place_ &&
        !buffer->region().packed_rkey().empty()) {
      return PostInPlace(chunk, index, std::move(buffer));
    }
    const UcxRegion* from = ring_.get();
    int64_t offset = 0;
    char* dst;
    if (buffer != nullptr) {
      from = &buffer->region();
      dst = buffer->data();
    } else {
      offset = (index % UcxKvSender::kSlots) * slot_bytes_;
      dst = ring_->data() + offset;
      std::memcpy(dst, chunk.data().data(), static_cast<size_t>(n));
    }
    if (index == faults_.corrupt_chunk && n > 0) dst[n / 2] ^= 0x5a;
    pb::KvPushMessage msg;
    pb::KvChunkRef* ref = Reference(chunk, index, n, &msg);
    ref->set_offset(offset);
    const uint64_t tag = ref->ucx_tag();
    // The reference first: D learns of every message P sent as long as the
    // stream lives (and discards the rest once it failed).
    if (absl::Status s = Fail(call_.Write(msg)); !s.ok()) return s;
    auto op = sender_->worker()->Send(*connection_, *from, offset, n, tag);
    if (!op.ok()) return Fail(op.status());
    sends_.push_back(PendingSend{*std::move(op), std::move(buffer)});
    return absl::OkStatus();
  }

  // The reference to chunk `index` of `n` bytes in `msg`: what every
  // path announces (tag: the push's prefix | the index).
  pb::KvChunkRef* Reference(const pb::KvChunk& chunk, int index, int64_t n,
                            pb::KvPushMessage* msg) const {
    pb::KvChunkRef* ref = msg->mutable_chunk_ref();
    ref->set_layer(chunk.layer());
    ref->set_token_begin(chunk.token_begin());
    ref->set_token_end(chunk.token_end());
    ref->set_length(n);
    ref->set_xxh3(chunk.xxh3());
    ref->set_ucx_tag(tag_prefix_ | static_cast<uint64_t>(index));
    return ref;
  }

  // Leaves the chunk in its buffer, which D maps (same host): no copy.
  absl::Status PostInPlace(const pb::KvChunk& chunk, int index,
                           std::unique_ptr<UcxChunkBuffer> buffer) {
    if (absl::Status s = Fail(MakeRoomInPlace()); !s.ok()) return s;
    const int64_t n = buffer->size();
    char* data = buffer->data();
    if (index == faults_.corrupt_chunk && n > 0) data[n / 2] ^= 0x5a;
    pb::KvPushMessage msg;
    pb::KvChunkRef* ref = Reference(chunk, index, n, &msg);
    const uint64_t tag = ref->ucx_tag();
    in_place_ack::Announce(buffer->ack_word(), tag);
    ref->set_ucx_rkey(buffer->region().packed_rkey());
    ref->set_address(reinterpret_cast<uintptr_t>(data));
    ref->set_ack_address(reinterpret_cast<uintptr_t>(buffer->ack_word()));
    in_place_chunks_.push_back(InPlaceChunk{std::move(buffer), tag});
    return Fail(call_.Write(msg));
  }

 public:
  absl::StatusOr<KvPushResult> Commit(const pb::KvCommit& commit) override {
    if (!error_.ok()) return error_;
    if (stalled_) return Fail(call_.FinishWithoutCommit());
    pb::KvPushMessage msg;
    *msg.mutable_commit() = commit;
    auto ack = call_.Finish(msg);
    if (!ack.ok()) return Fail(ack.status());
    // D acknowledged after receiving every message: the sends are done
    // (their completions may trail a moment).
    committed_ = true;
    // D acknowledged the push after importing every chunk: none is read.
    for (InPlaceChunk& c : in_place_chunks_) c.buffer->Release(true);
    in_place_chunks_.clear();
    std::unique_ptr<UcxRegion> done;
    if (SendsDone(absl::Seconds(10))) {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) done = std::move(ring_);
    }
    if (done != nullptr) sender_->ReturnRegion(std::move(done), true);
    return KvPushResult{ack->bytes_received(), ack->transfer_seconds(), "ucx"};
  }

  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    call_.Cancel();
  }

 private:
  bool Cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

  // Waits up to `timeout` for every outstanding send; true when none is
  // left.
  bool SendsDone(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!sends_.empty()) {
      if (!sends_.front().op.Wait(deadline - absl::Now())) return false;
      PopSend().IgnoreError();
    }
    return true;
  }

  // OK passes; an error fails the push for good (and, unless a
  // cancellation, forgets the target's answer).
  absl::Status Fail(absl::Status s) {
    if (s.ok()) return s;
    if (!absl::IsCancelled(s)) sender_->Forget(target_);  // ask D again
    if (error_.ok()) error_ = s;
    return error_;
  }

  UcxKvSender* const sender_;
  const std::string target_;
  const pb::KvHeader header_;
  const absl::Time deadline_;
  const KvFaultInjection faults_;
  const uint64_t tag_prefix_;
  const int64_t slot_bytes_;
  // Held until a successful commit hands it back to the pool (under mu_);
  // otherwise the destructor returns it for quarantine. Read without the
  // lock by the driving thread, which alone moves it.
  std::unique_ptr<UcxRegion> ring_;
  std::unique_ptr<UcxConnection> connection_;
  KvPushCall call_;
  const bool in_place_;  // D maps this worker's buffers (its Describe)
  std::deque<PendingSend> sends_;             // outstanding, oldest first
  std::deque<InPlaceChunk> in_place_chunks_;  // unacknowledged, oldest first
  absl::Status error_;
  int chunks_sent_ = 0;
  bool stalled_ = false;
  bool committed_ = false;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvPushStream>> OpenUcxPushStream(
    UcxKvSender* sender, const std::string& target, const pb::KvHeader& header,
    absl::Time deadline, int64_t slot_bytes, std::unique_ptr<UcxRegion> ring,
    std::unique_ptr<UcxConnection> connection, bool in_place) {
  auto stream = std::make_unique<UcxKvPushStream>(
      sender, target, header, deadline, slot_bytes, std::move(ring),
      std::move(connection), in_place);
  absl::Status s = stream->Start();
  if (!s.ok()) return s;
  return stream;
}

}  // namespace pdserve::transport
