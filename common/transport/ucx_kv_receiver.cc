#include "common/transport/ucx_kv_receiver.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/transport/kv_wire.h"
#include "common/transport/ucx_in_place_ack.h"
#include "common/util/logging.h"

namespace pdserve::transport {

int64_t UcxLandingPool::SizeClass(int64_t bytes) const {
  int64_t size = kMinBufferBytes;
  while (size < bytes && size < max_buffer_bytes_) size *= 2;
  return std::min(size, std::max(bytes, max_buffer_bytes_));
}

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxLandingPool::Take(int64_t bytes) {
  const int64_t size = SizeClass(bytes);
  {
    absl::MutexLock lock(&mu_);
    ++in_use_;
    auto it = idle_.find(size);
    if (it != idle_.end() && !it->second.empty()) {
      std::unique_ptr<UcxRegion> r = std::move(it->second.back());
      it->second.pop_back();
      idle_bytes_ -= r->size();
      return r;
    }
  }
  auto r = worker_->Allocate(size);
  if (!r.ok()) {
    absl::MutexLock lock(&mu_);
    --in_use_;
  }
  return r;
}

void UcxLandingPool::Forget() {
  absl::MutexLock lock(&mu_);
  --in_use_;
}

void UcxLandingPool::Return(std::unique_ptr<UcxRegion> buffer) {
  std::unique_ptr<UcxRegion> drop;
  {
    absl::MutexLock lock(&mu_);
    --in_use_;
    if (idle_bytes_ + buffer->size() <= kMaxIdleBytes) {
      idle_bytes_ += buffer->size();
      idle_[buffer->size()].push_back(std::move(buffer));
    } else {
      drop = std::move(buffer);  // unregistered outside the lock
    }
  }
}

int UcxLandingPool::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

namespace {

// One push's chunks, each received into one of two landing buffers (taken
// from the pool at the first chunk P sends as a message, so a push whose
// chunks all stay in place holds none), or (chunks P left in place) read
// from P's export buffer, mapped here, and acknowledged in its ack word once
// the sink has consumed it (or the next chunk is fetched, or the push ends).
// Before a chunk received as a message is handed out, the receive of the next
// index is posted into the other buffer: the next transfer (a rendezvous P
// cannot start before D posts its receive) overlaps this chunk's verification
// and import.
class UcxChunkSource : public KvChunkSource {
 public:
  UcxChunkSource(UcxKvReceiver* receiver, UcxLandingPool* pool,
                 std::atomic<int>* open_sources, pb::KvUcxSource source,
                 int64_t max_chunk_bytes)
      : receiver_(receiver),
        pool_(pool),
        open_sources_(open_sources),
        source_(std::move(source)),
        max_chunk_bytes_(max_chunk_bytes) {
    open_sources_->fetch_add(1);
  }

  ~UcxChunkSource() override {
    AckInPlace();
    // The receive posted ahead for a chunk that never came (the last one's
    // successor): no message matches it, so it ends at once.
    CancelAhead();
    for (std::unique_ptr<UcxRegion>& landing : landing_) {
      if (landing == nullptr) {
        // No chunk came as a message (or only one did).
      } else if (reusable_) {
        pool_->Return(std::move(landing));
      } else {
        // UCX may still write into it (a receive it did not end): leave it
        // registered and mapped rather than let another push reuse it.
        PDSERVE_LOG_WARNING("UCX landing buffer of %lld bytes left behind",
                            static_cast<long long>(landing->size()));
        pool_->Forget();
        (void)landing.release();
      }
    }
    open_sources_->fetch_sub(1);
  }

  absl::StatusOr<KvChunkView> Fetch(
      const pb::KvChunkRef& ref,
      const std::function<bool()>& cancelled) override {
    if ((ref.ucx_tag() & ~UcxKvReceiver::kChunkMask) != source_.tag_prefix()) {
      return absl::InvalidArgumentError("KV chunk: UCX tag of another push");
    }
    AckInPlace();
    if (ref.length() < 0 || ref.length() > max_chunk_bytes_) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV chunk of ", ref.length(), " bytes exceeds this ",
                       "push's largest (", max_chunk_bytes_, ")"));
    }
    if (!ref.ucx_rkey().empty()) {
      // A push P has given up on (cancelled the call) may name a buffer P
      // no longer keeps: not mapped (ucx_kv_sender.h, kMapGrace).
      if (cancelled && cancelled()) {
        return absl::CancelledError("KV push cancelled");
      }
      return FetchInPlace(ref);
    }
    // The chunk's bytes land in the buffer its receive was posted into
    // ahead, else in the one the last chunk's view (ended now) used.
    int into = current_;
    absl::StatusOr<int64_t> n;
    if (ahead_.posted() && ahead_.tag() == ref.ucx_tag()) {
      into = 1 - current_;
      n = receiver_->worker()->AwaitReceive(ahead_, cancelled);
    } else {
      // Posted for a chunk P left in place (or none posted).
      if (!CancelAhead()) return absl::AbortedError("UCX receive not ended");
      if (absl::Status s = EnsureLanding(into); !s.ok()) return s;
      if (ref.length() > landing_[into]->size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("KV chunk of ", ref.length(),
                         " bytes exceeds the UCX landing buffer of ",
                         landing_[into]->size()));
      }
      n = receiver_->worker()->Receive(*landing_[into], 0, ref.length(),
                                       ref.ucx_tag(), cancelled);
    }
    if (absl::IsAborted(n.status())) reusable_ = false;
    if (!n.ok()) return n.status();
    if (*n != ref.length()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV chunk: UCX message of ", *n, " bytes, the ",
                       "reference says ", ref.length()));
    }
    current_ = into;
    PostAhead(ref.ucx_tag());
    return KvChunkView{ref.layer(), ref.token_begin(), ref.token_end(),
                       absl::string_view(landing_[into]->data(),
                                         static_cast<size_t>(ref.length())),
                       ref.xxh3()};
  }

  void Consumed() override { AckInPlace(); }

  void Failed(const absl::Status&) override {
    receiver_->Abandon(source_);
    receiver_->ForgetPeer(source_.worker_address());
  }

 private:
  // A chunk P left in its export buffer: the view is P's memory, mapped.
  absl::StatusOr<KvChunkView> FetchInPlace(const pb::KvChunkRef& ref) {
    auto memory =
        receiver_->MapPeerBuffer(source_.worker_address(), ref.ucx_rkey());
    if (!memory.ok()) return memory.status();
    const char* bytes =
        static_cast<const char*>((*memory)->Pointer(ref.address()));
    auto* ack = static_cast<uint64_t*>((*memory)->Pointer(ref.ack_address()));
    // The ack word follows the bytes in the same buffer (P's layout).
    if (ref.ack_address() !=
        ref.address() + (static_cast<uint64_t>(ref.length()) + 63) / 64 * 64) {
      return absl::InvalidArgumentError(
          "KV chunk in place: malformed buffer reference");
    }
    if (bytes == nullptr || ack == nullptr ||
        (reinterpret_cast<uintptr_t>(ack) & 7) != 0) {
      return absl::InvalidArgumentError(
          "KV chunk in place: the prefill worker's buffer does not map here");
    }
    if (!in_place_ack::ValidTag(ref.ucx_tag())) {
      return absl::InvalidArgumentError("KV chunk in place: malformed tag");
    }
    // P may have given up on this push (and will reuse the buffer): the
    // chunk is read only if claimed before P revoked it.
    if (!in_place_ack::Claim(ack, ref.ucx_tag())) {
      return absl::UnavailableError(
          "KV chunk in place withdrawn by the prefill worker (its push "
          "failed)");
    }
    in_place_ = InPlace{*std::move(memory), ack, ref.ucx_tag()};
    return KvChunkView{
        ref.layer(), ref.token_begin(), ref.token_end(),
        absl::string_view(bytes, static_cast<size_t>(ref.length())),
        ref.xxh3()};
  }

  // A landing buffer in landing_[i] (every one holds the push's largest
  // chunk).
  absl::Status EnsureLanding(int i) {
    if (landing_[i] != nullptr) return absl::OkStatus();
    auto landing = pool_->Take(max_chunk_bytes_);
    if (!landing.ok()) return landing.status();
    landing_[i] = *std::move(landing);
    return absl::OkStatus();
  }

  // Posts the receive of the chunk after `tag` into the buffer the current
  // chunk's view does not use. Best effort: without it the next chunk is
  // received when fetched.
  void PostAhead(uint64_t tag) {
    if ((tag & UcxKvReceiver::kChunkMask) == UcxKvReceiver::kChunkMask) return;
    const int other = 1 - current_;
    if (!EnsureLanding(other).ok()) return;
    const int64_t bytes = std::min(max_chunk_bytes_, landing_[other]->size());
    auto op =
        receiver_->worker()->PostReceive(*landing_[other], 0, bytes, tag + 1);
    if (op.ok()) ahead_ = *std::move(op);
  }

  // Cancels the receive posted ahead, if any; false (and the buffers are
  // not reused) when UCX did not end it.
  bool CancelAhead() {
    if (!ahead_.posted()) return true;
    if (receiver_->worker()->CancelReceive(ahead_, kCancelAheadWait)) {
      return true;
    }
    reusable_ = false;
    return false;
  }
  static constexpr absl::Duration kCancelAheadWait = absl::Seconds(2);

  // Tells P that the last chunk fetched in place is no longer read (its
  // view ends with Consumed, the next Fetch or this source).
  void AckInPlace() {
    if (in_place_.memory == nullptr) return;
    in_place_ack::Release(in_place_.ack, in_place_.tag);
    in_place_ = InPlace();
  }

  struct InPlace {
    std::shared_ptr<UcxRemoteMemory> memory;  // null: none pending
    uint64_t* ack = nullptr;
    uint64_t tag = 0;
  };

  UcxKvReceiver* const receiver_;
  UcxLandingPool* const pool_;
  std::atomic<int>* const open_sources_;
  const pb::KvUcxSource source_;
  const int64_t max_chunk_bytes_;
  // Null until needed (a chunk comes as a message, or a receive is posted
  // ahead); current_: the one the last message chunk's view uses.
  std::unique_ptr<UcxRegion> landing_[2];
  int current_ = 0;
  UcxRecvOp ahead_;  // the next chunk's receive, posted ahead
  bool reusable_ = true;
  InPlace in_place_;
};

}  // namespace

UcxKvReceiver::UcxKvReceiver(UcxWorker* worker, int64_t max_chunk_bytes)
    : worker_(worker),
      landing_(worker, std::max(max_chunk_bytes, kKvChunkTargetBytes)) {}

void UcxKvReceiver::Describe(const pb::KvDescribeRequest& request,
                             pb::KvDescribeResponse* response) {
  response->set_ucx_worker_address(worker_->address());
  response->set_ucx_host_id(UcxHostId());
  response->set_ucx_transports(worker_->transports());
  const pb::KvUcxProbe& probe = request.ucx_probe();
  if (probe.rkey().empty() || probe.nonce().empty() ||
      probe.host_id() != UcxHostId() ||
      !UcxTlsAllowsSharedMemory(worker_->transports())) {
    return;
  }
  auto memory = worker_->MapRemote(probe.worker_address(), probe.rkey());
  if (!memory.ok()) {
    PDSERVE_LOG_INFO("KV in place: cannot map a prefill worker's memory: %s",
                     memory.status().ToString());
    return;
  }
  const void* p = (*memory)->Pointer(probe.address());
  response->set_ucx_in_place(
      p != nullptr &&
      std::memcmp(p, probe.nonce().data(), probe.nonce().size()) == 0);
  // The probe's endpoint is not kept: pushes map P's buffers afresh.
  (*memory)->connection().CloseWhenUnused();
}

absl::StatusOr<std::shared_ptr<UcxRemoteMemory>> UcxKvReceiver::MapPeerBuffer(
    const std::string& peer_address, const std::string& packed_rkey) {
  const absl::Time now = absl::Now();
  std::vector<std::shared_ptr<UcxRemoteMemory>> drop;  // released unlocked
  {
    absl::MutexLock lock(&mu_);
    auto it = mappings_.find({peer_address, packed_rkey});
    if (it != mappings_.end()) {
      it->second.used = now;
      return it->second.memory;
    }
    DropIdleLocked(now, &drop);
    while (static_cast<int>(mappings_.size()) >= kMaxMappings) {
      auto oldest = mappings_.begin();
      for (auto m = mappings_.begin(); m != mappings_.end(); ++m) {
        if (m->second.used < oldest->second.used) oldest = m;
      }
      drop.push_back(std::move(oldest->second.memory));
      mappings_.erase(oldest);
    }
  }
  drop.clear();
  auto memory = worker_->MapRemote(peer_address, packed_rkey);
  if (!memory.ok()) return memory.status();
  std::shared_ptr<UcxRemoteMemory> shared = *std::move(memory);
  absl::MutexLock lock(&mu_);
  auto [it, fresh] = mappings_.emplace(
      std::make_pair(peer_address, packed_rkey), Mapping{shared, now});
  if (!fresh) drop.push_back(std::move(shared));  // mapped meanwhile
  return it->second.memory;
}

void UcxKvReceiver::ForgetPeer(const std::string& peer_address) {
  std::vector<std::shared_ptr<UcxRemoteMemory>> drop;
  {
    absl::MutexLock lock(&mu_);
    for (auto m = mappings_.begin(); m != mappings_.end();) {
      if (m->first.first == peer_address) {
        m->second.memory->connection().CloseWhenUnused();
        drop.push_back(std::move(m->second.memory));
        m = mappings_.erase(m);
      } else {
        ++m;
      }
    }
  }
}

void UcxKvReceiver::DropIdleLocked(
    absl::Time now, std::vector<std::shared_ptr<UcxRemoteMemory>>* drop) {
  for (auto m = mappings_.begin(); m != mappings_.end();) {
    if (now - m->second.used > kMappingIdle) {
      drop->push_back(std::move(m->second.memory));
      m = mappings_.erase(m);
    } else {
      ++m;
    }
  }
}

int UcxKvReceiver::mapped_buffers() {
  std::vector<std::shared_ptr<UcxRemoteMemory>> drop;  // released unlocked
  absl::MutexLock lock(&mu_);
  DropIdleLocked(absl::Now(), &drop);
  return static_cast<int>(mappings_.size());
}

absl::StatusOr<std::unique_ptr<KvChunkSource>> UcxKvReceiver::Open(
    const pb::KvHeader& header) {
  const pb::KvUcxSource& source = header.ucx();
  if (source.tag_prefix() == 0 || (source.tag_prefix() & kChunkMask) != 0) {
    return absl::InvalidArgumentError("KV header: malformed UCX tag prefix");
  }
  auto type = ParseUcxMemoryType(source.memory_type());
  if (!type.ok()) return type.status();
  auto layout = LayoutFromProto(header.layout());
  if (!layout.ok()) return layout.status();
  const int64_t max_chunk_bytes =
      MaxChunkBytes(header.num_tokens(), layout->BytesPerTokenPerLayer(),
                    kKvChunkTargetBytes);
  return std::make_unique<UcxChunkSource>(this, &landing_, &open_sources_,
                                          source, max_chunk_bytes);
}

void UcxKvReceiver::Abandon(const pb::KvUcxSource& source) {
  if (source.tag_prefix() == 0 || (source.tag_prefix() & kChunkMask) != 0) {
    return;
  }
  worker_->DrainLater(source.tag_prefix(), ~kChunkMask, kDrainFor);
}

}  // namespace pdserve::transport
