#include "common/transport/ucx_kv_receiver.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/logging.h"

namespace pdserve::transport {

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxLandingPool::Take() {
  {
    absl::MutexLock lock(&mu_);
    ++in_use_;
    if (!idle_.empty()) {
      std::unique_ptr<UcxRegion> r = std::move(idle_.back());
      idle_.pop_back();
      return r;
    }
  }
  auto r = worker_->Allocate(buffer_bytes_);
  if (!r.ok()) {
    absl::MutexLock lock(&mu_);
    --in_use_;
  }
  return r;
}

void UcxLandingPool::Return(std::unique_ptr<UcxRegion> buffer) {
  std::unique_ptr<UcxRegion> drop;
  {
    absl::MutexLock lock(&mu_);
    --in_use_;
    if (static_cast<int>(idle_.size()) < kMaxIdle) {
      idle_.push_back(std::move(buffer));
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

// One push's chunks, read from P's region into one landing buffer.
class UcxChunkSource : public KvChunkSource {
 public:
  UcxChunkSource(UcxWorker* worker, UcxLandingPool* pool,
                 std::unique_ptr<UcxRemoteRegion> remote,
                 std::unique_ptr<UcxRegion> landing)
      : worker_(worker),
        pool_(pool),
        remote_(std::move(remote)),
        landing_(std::move(landing)) {}

  ~UcxChunkSource() override {
    // No get is in flight (Fetch waits for its get): the key and the
    // endpoint reference go first, then the landing buffer is reusable.
    remote_.reset();
    pool_->Return(std::move(landing_));
  }

  absl::StatusOr<KvChunkView> Fetch(
      const pb::KvChunkRef& ref,
      const std::function<bool()>& cancelled) override {
    if (ref.offset() < 0 || ref.length() < 0 ||
        ref.offset() > remote_->size() ||
        ref.length() > remote_->size() - ref.offset()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV chunk: bytes [", ref.offset(), ", +", ref.length(),
          ") outside the UCX export region of ", remote_->size(), " bytes"));
    }
    if (ref.length() > landing_->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV chunk of ", ref.length(),
          " bytes exceeds the UCX landing buffer of ", landing_->size()));
    }
    absl::Status s = worker_->Get(*remote_, ref.offset(), *landing_, 0,
                                  ref.length(), cancelled);
    if (!s.ok()) return s;
    return KvChunkView{
        ref.layer(), ref.token_begin(), ref.token_end(),
        absl::string_view(landing_->data(), static_cast<size_t>(ref.length())),
        ref.xxh3()};
  }

  void Failed(const absl::Status& status) override {
    // P may be gone (a dead P looks like a cancelled stream here): close the
    // endpoint when no other push uses it rather than when it has been idle
    // for a while, so nothing of a dead peer stays here. A live P gets a
    // new endpoint with its next push.
    worker_->CloseWhenUnused(*remote_);
  }

 private:
  UcxWorker* const worker_;
  UcxLandingPool* const pool_;
  std::unique_ptr<UcxRemoteRegion> remote_;
  std::unique_ptr<UcxRegion> landing_;
};

}  // namespace

UcxKvReceiver::UcxKvReceiver(UcxWorker* worker, int64_t max_chunk_bytes)
    : worker_(worker),
      landing_(worker, std::max(max_chunk_bytes, kKvChunkTargetBytes)) {}

void UcxKvReceiver::Describe(pb::KvDescribeResponse* response) const {
  response->set_ucx_worker_address(worker_->address());
  response->set_ucx_host_id(UcxHostId());
  response->set_ucx_transports(worker_->transports());
}

absl::StatusOr<std::unique_ptr<KvChunkSource>> UcxKvReceiver::Open(
    const pb::KvUcxSource& source, int64_t expected_bytes) {
  if (source.size() < expected_bytes || source.worker_address().empty() ||
      source.rkey().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV header: UCX export region of ", source.size(),
                     " bytes (the push needs ", expected_bytes,
                     ") or no worker address / remote key"));
  }
  auto type = ParseUcxMemoryType(source.memory_type());
  if (!type.ok()) return type.status();
  // Same host: UCX may use its shared-memory transports, which in UCX 1.13
  // do not support peer-failure detection (asking for it would leave only
  // TCP); the push stream notices a dead P there.
  const bool same_host = !source.host_id().empty() &&
                         source.host_id() == UcxHostId() &&
                         UcxTlsAllowsSharedMemory(worker_->transports());
  auto remote = worker_->Attach(source.worker_address(), !same_host,
                                source.rkey(), source.address(), source.size());
  if (!remote.ok()) return remote.status();
  auto landing = landing_.Take();
  if (!landing.ok()) return landing.status();
  return std::make_unique<UcxChunkSource>(
      worker_, &landing_, *std::move(remote), *std::move(landing));
}

}  // namespace pdserve::transport
