#include "common/transport/ucx_kv_receiver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/transport/kv_wire.h"
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

// One push's chunks, each received into one landing buffer.
class UcxChunkSource : public KvChunkSource {
 public:
  UcxChunkSource(UcxKvReceiver* receiver, UcxLandingPool* pool,
                 pb::KvUcxSource source, std::unique_ptr<UcxRegion> landing)
      : receiver_(receiver),
        pool_(pool),
        source_(std::move(source)),
        landing_(std::move(landing)) {}

  ~UcxChunkSource() override {
    if (reusable_) {
      pool_->Return(std::move(landing_));
    } else {
      // UCX may still write into it (a receive it did not end): leave it
      // registered and mapped rather than let another push reuse it.
      PDSERVE_LOG_WARNING("UCX landing buffer of %lld bytes left behind",
                          static_cast<long long>(landing_->size()));
      pool_->Forget();
      (void)landing_.release();
    }
  }

  absl::StatusOr<KvChunkView> Fetch(
      const pb::KvChunkRef& ref,
      const std::function<bool()>& cancelled) override {
    if ((ref.ucx_tag() & ~UcxKvReceiver::kChunkMask) != source_.tag_prefix()) {
      return absl::InvalidArgumentError("KV chunk: UCX tag of another push");
    }
    if (ref.length() < 0 || ref.length() > landing_->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV chunk of ", ref.length(),
          " bytes exceeds the UCX landing buffer of ", landing_->size()));
    }
    auto n = receiver_->worker()->Receive(*landing_, 0, ref.length(),
                                          ref.ucx_tag(), cancelled);
    if (absl::IsAborted(n.status())) reusable_ = false;
    if (!n.ok()) return n.status();
    if (*n != ref.length()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV chunk: UCX message of ", *n, " bytes, the ",
                       "reference says ", ref.length()));
    }
    return KvChunkView{
        ref.layer(), ref.token_begin(), ref.token_end(),
        absl::string_view(landing_->data(), static_cast<size_t>(ref.length())),
        ref.xxh3()};
  }

  void Failed(const absl::Status&) override { receiver_->Abandon(source_); }

 private:
  UcxKvReceiver* const receiver_;
  UcxLandingPool* const pool_;
  const pb::KvUcxSource source_;
  std::unique_ptr<UcxRegion> landing_;
  bool reusable_ = true;
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
    const pb::KvHeader& header) {
  const pb::KvUcxSource& source = header.ucx();
  if (source.tag_prefix() == 0 || (source.tag_prefix() & kChunkMask) != 0) {
    return absl::InvalidArgumentError("KV header: malformed UCX tag prefix");
  }
  auto type = ParseUcxMemoryType(source.memory_type());
  if (!type.ok()) return type.status();
  auto layout = LayoutFromProto(header.layout());
  if (!layout.ok()) return layout.status();
  auto landing = landing_.Take(MaxChunkBytes(header.num_tokens(),
                                             layout->BytesPerTokenPerLayer(),
                                             kKvChunkTargetBytes));
  if (!landing.ok()) return landing.status();
  return std::make_unique<UcxChunkSource>(this, &landing_, source,
                                          *std::move(landing));
}

void UcxKvReceiver::Abandon(const pb::KvUcxSource& source) {
  if (source.tag_prefix() == 0 || (source.tag_prefix() & kChunkMask) != 0) {
    return;
  }
  worker_->DrainLater(source.tag_prefix(), ~kChunkMask, kDrainFor);
}

}  // namespace pdserve::transport
