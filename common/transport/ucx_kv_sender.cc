#include "common/transport/ucx_kv_sender.h"

#include <sys/random.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/transport/kv_wire.h"
#include "common/transport/ucx_in_place_ack.h"
#include "common/transport/ucx_kv_push_stream.h"
#include "common/util/logging.h"

namespace pdserve::transport {

bool UcxKvSender::InPlaceDefault() {
  const char* v = std::getenv("PDSERVE_UCX_IN_PLACE");
  return v == nullptr || std::string(v) != "0";
}

int UcxKvSender::InPlaceUnackedDefault() {
  const char* v = std::getenv("PDSERVE_UCX_IN_PLACE_UNACKED");
  int n = 0;
  if (v != nullptr && absl::SimpleAtoi(v, &n) && n >= 2 && n <= kSlots) {
    return n;
  }
  return 2;
}

UcxKvSender::UcxKvSender(GrpcKvSender* grpc, UcxWorker* worker,
                         KvSender* fallback, Options options)
    : grpc_(grpc),
      worker_(worker),
      fallback_(fallback),
      options_(options),
      in_place_(options.in_place &&
                UcxTlsAllowsSharedMemory(worker->transports())) {
  reaper_ = std::thread([this] { ReapLoop(); });
}

UcxKvSender::~UcxKvSender() {
  std::vector<Pooled> drop;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    drop.swap(pool_);
  }
  reaper_.join();
}

void UcxKvSender::ReapLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
    const absl::Time now = absl::Now();
    // pool_ is in the order regions came back: the last ones up to
    // warm_bytes stay, however long idle, unless the last push failed.
    const int64_t warm_bytes = keep_warm_ ? options_.warm_bytes : 0;
    size_t warm_from = pool_.size();
    for (int64_t warm = 0; warm_from > 0; --warm_from) {
      warm += pool_[warm_from - 1].region->size();
      if (warm > warm_bytes) break;
    }
    std::vector<Pooled> drop;
    for (size_t i = 0; i < warm_from;) {
      Pooled& p = pool_[i];
      if (now - p.since >= options_.pool_idle && p.Droppable(now)) {
        drop.push_back(std::move(p));
        pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(i));
        --warm_from;
      } else {
        ++i;
      }
    }
    if (!drop.empty()) {
      mu_.Unlock();
      drop.clear();  // unregisters outside the lock
      mu_.Lock();
    }
  }
}

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxKvSender::TakeRegion(
    int64_t bytes, bool shared) {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    auto best = pool_.end();
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      const int64_t size = it->region->size();
      if (it->Reusable(now) && size >= bytes &&
          it->region->packed_rkey().empty() != shared &&
          size / 2 <= std::max(bytes, kRegionRound) &&
          (best == pool_.end() || size < best->region->size())) {
        best = it;
      }
    }
    if (best != pool_.end()) {
      std::unique_ptr<UcxRegion> r = std::move(best->region);
      pool_.erase(best);
      in_use_.fetch_add(1);
      return r;
    }
  }
  auto r = shared ? worker_->AllocateShared(bytes) : worker_->Allocate(bytes);
  if (r.ok()) in_use_.fetch_add(1);
  return r;
}

bool UcxKvSender::Pooled::Reusable(absl::Time now) const {
  if (now >= not_before) return true;
  return read_word != nullptr && in_place_ack::Released(read_word, read_done);
}

void UcxKvSender::ReturnRegion(std::unique_ptr<UcxRegion> region, bool clean) {
  const absl::Time now = absl::Now();
  const absl::Time from = clean ? now : now + options_.quarantine;
  Pool(Pooled{std::move(region), now, from, from}, clean);
}

void UcxKvSender::ReturnRevokedRegion(std::unique_ptr<UcxRegion> region) {
  const absl::Time now = absl::Now();
  Pool(Pooled{std::move(region), now, now, now + kMapGrace}, false);
}

void UcxKvSender::ReturnRegionWhileRead(std::unique_ptr<UcxRegion> region,
                                        const uint64_t* ack_word,
                                        uint64_t done) {
  const absl::Time now = absl::Now();
  const absl::Time backstop = now + kReadBackstop;
  Pool(Pooled{std::move(region), now, backstop, backstop, ack_word, done},
       false);
}

void UcxKvSender::Pool(Pooled returned, bool clean) {
  in_use_.fetch_sub(1);
  absl::MutexLock lock(&mu_);
  if (stop_) {
    mu_.Unlock();
    returned.region.reset();  // unregisters outside the lock
    mu_.Lock();
    return;
  }
  const absl::Time now = returned.since;
  keep_warm_ = clean;
  pool_.push_back(std::move(returned));
  int64_t pooled_bytes = 0;
  for (const Pooled& p : pool_) pooled_bytes += p.region->size();
  // Drop the oldest regions that nobody can still be reading.
  std::vector<std::unique_ptr<UcxRegion>> drops;
  for (auto it = pool_.begin();
       pooled_bytes > kMaxPooledBytes && it != pool_.end();) {
    if (it->Droppable(now)) {
      pooled_bytes -= it->region->size();
      drops.push_back(std::move(it->region));
      it = pool_.erase(it);
    } else {
      ++it;
    }
  }
  if (!drops.empty()) {
    mu_.Unlock();
    drops.clear();  // unregisters outside the lock
    mu_.Lock();
  }
}

std::unique_ptr<KvChunkBuffer> UcxKvSender::NewChunkBuffer(
    const std::string& target, int64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(target);
    if (bytes <= 0 || (it != peers_.end() && !it->second.usable)) {
      return KvSender::NewChunkBuffer(target, bytes);  // for the fallback
    }
  }
  // Room for the ack word; shared memory where D may map it, in power-of-two
  // sizes (at least 64 KiB): chunks of every prompt length reuse a few
  // pooled segments, which decode workers keep mapped.
  int64_t size = UcxChunkBuffer::AckOffset(bytes) + UcxChunkBuffer::kAckBytes;
  if (in_place_) {
    int64_t rounded = int64_t{64} << 10;
    while (rounded < size) rounded *= 2;
    size = rounded;
  }
  auto region = TakeRegion(size, in_place_);
  if (!region.ok()) return KvSender::NewChunkBuffer(target, bytes);
  return std::make_unique<UcxChunkBuffer>(this, *std::move(region), bytes);
}

int UcxKvSender::pooled_regions() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pool_.size());
}

absl::StatusOr<UcxKvSender::Peer> UcxKvSender::PeerOf(const std::string& target,
                                                      absl::Time deadline) {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(target);
    if (it != peers_.end() &&
        (it->second.usable || now - it->second.at < kNegativeTtl)) {
      return it->second;
    }
  }
  // With a probe of this worker's shared memory: whether D can map it.
  pb::KvDescribeRequest request;
  std::unique_ptr<UcxRegion> probe;
  if (in_place_) {
    auto region = worker_->AllocateShared(4096);
    if (region.ok()) {
      probe = *std::move(region);
      pb::KvUcxProbe* p = request.mutable_ucx_probe();
      p->set_worker_address(worker_->address());
      p->set_host_id(UcxHostId());
      p->set_rkey(probe->packed_rkey());
      p->set_address(reinterpret_cast<uintptr_t>(probe->data()));
      std::string nonce(32, '\0');
      if (getrandom(nonce.data(), nonce.size(), 0) !=
          static_cast<ssize_t>(nonce.size())) {
        nonce.assign(32, 'p');
      }
      std::memcpy(probe->data(), nonce.data(), nonce.size());
      p->set_nonce(nonce);
    }
  }
  auto described = grpc_->Describe(target, deadline, request);
  if (probe != nullptr && !described.ok()) {
    // D may still map the probe (a Describe that timed out here runs on
    // there): kept as a revoked region is.
    in_use_.fetch_add(1);  // as if taken from the pool
    ReturnRevokedRegion(std::move(probe));
  }
  probe.reset();
  if (!described.ok()) return described.status();  // not cached
  Peer peer;
  peer.at = now;
  peer.usable = !described->ucx_worker_address().empty();
  peer.address = described->ucx_worker_address();
  peer.in_place = described->ucx_in_place();
  // Same host with shared memory allowed on both sides: no peer-failure
  // detection, which in UCX 1.13 would leave only TCP (the push stream
  // notices a dead decode worker there).
  peer.peer_errors = !(described->ucx_host_id() == UcxHostId() &&
                       UcxTlsAllowsSharedMemory(worker_->transports()) &&
                       UcxTlsAllowsSharedMemory(described->ucx_transports()));
  absl::MutexLock lock(&mu_);
  peers_[target] = peer;
  return peer;
}

absl::StatusOr<bool> UcxKvSender::UcxUsable(const std::string& target,
                                            absl::Time deadline) {
  auto peer = PeerOf(target, deadline);
  if (!peer.ok()) return peer.status();
  return peer->usable;
}

void UcxKvSender::Forget(const std::string& target) {
  absl::MutexLock lock(&mu_);
  peers_.erase(target);
}

absl::StatusOr<std::unique_ptr<KvPushStream>> UcxKvSender::Open(
    const std::string& target, const pb::KvHeader& header,
    absl::Time deadline) {
  auto peer = PeerOf(target, deadline);
  if (!peer.ok() || !peer->usable) {
    if (fallback_ != nullptr) return fallback_->Open(target, header, deadline);
    return absl::FailedPreconditionError(absl::StrCat(
        "--kv_transport=ucx: decode worker ", target,
        " accepts no UCX pushes (started with another --kv_transport, or "
        "without UCX",
        peer.ok() ? "" : absl::StrCat("; ", peer.status().ToString()),
        "); use --kv_transport=auto"));
  }
  auto connection = worker_->Connect(peer->address, peer->peer_errors);
  if (!connection.ok()) {
    Forget(target);
    if (fallback_ == nullptr) return connection.status();
    PDSERVE_LOG_WARNING("KV push %s not over UCX: %s", header.request_id(),
                        connection.status().ToString());
    return fallback_->Open(target, header, deadline);
  }
  auto layout = LayoutFromProto(header.layout());
  if (!layout.ok()) return layout.status();
  // The largest chunk ChunkTokenRanges cuts from this push: a short
  // prompt's ring is small (hundreds of concurrent pushes must not each
  // hold 8 target-sized slots).
  const int64_t slot_bytes =
      MaxChunkBytes(header.num_tokens(), layout->BytesPerTokenPerLayer(),
                    kKvChunkTargetBytes);
  auto ring = TakeRegion(slot_bytes * kSlots, false);
  if (!ring.ok()) {
    if (fallback_ == nullptr) return ring.status();
    PDSERVE_LOG_WARNING("KV push %s not over UCX: %s", header.request_id(),
                        ring.status().ToString());
    return fallback_->Open(target, header, deadline);
  }
  return OpenUcxPushStream(this, target, header, deadline, slot_bytes,
                           *std::move(ring), *std::move(connection),
                           peer->in_place && !peer->peer_errors);
}

}  // namespace pdserve::transport
