// The UCX push stream of UcxKvSender (ucx_kv_sender.h), and the chunk
// buffers it sends in place or leaves for the decode worker to map. Internal
// to the UCX transport.
#ifndef PDSERVE_COMMON_TRANSPORT_UCX_KV_PUSH_STREAM_H_
#define PDSERVE_COMMON_TRANSPORT_UCX_KV_PUSH_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/kv_transport.h"
#include "common/transport/ucx_kv_sender.h"
#include "common/transport/ucx_worker.h"

namespace pdserve::transport {

// A chunk buffer that is a pooled region registered with the sender's
// worker: its push sends it in place (no copy into the ring). The region
// goes back to the pool when the buffer dies, or when its send ended
// (Release). Thread-compatible.
class UcxChunkBuffer : public KvChunkBuffer {
 public:
  UcxChunkBuffer(UcxKvSender* sender, std::unique_ptr<UcxRegion> region,
                 int64_t size)
      : sender_(sender), region_(std::move(region)), size_(size) {}
  ~UcxChunkBuffer() override { Release(true); }
  char* data() override { return region_->data(); }
  int64_t size() const override { return size_; }
  std::string TakeBytes() override {
    return std::string(region_->data(), static_cast<size_t>(size_));
  }
  UcxKvSender* sender() const { return sender_; }
  const UcxRegion& region() const { return *region_; }
  // The word D stores a chunk's tag into when it no longer reads the chunk
  // in place: after the bytes, 64-byte aligned (NewChunkBuffer leaves room).
  uint64_t* ack_word() const {
    return reinterpret_cast<uint64_t*>(region_->data() + AckOffset(size_));
  }
  static int64_t AckOffset(int64_t size) { return (size + 63) / 64 * 64; }
  static constexpr int64_t kAckBytes = 64;
  // Back to the pool; `clean`: nobody reads it any more (its send
  // succeeded, or it was never sent), else it is quarantined.
  void Release(bool clean) {
    if (region_ != nullptr) sender_->ReturnRegion(std::move(region_), clean);
  }
  // Back to the pool, revoked (ucx_in_place_ack.h): D may map it but not
  // read it.
  void ReleaseRevoked() {
    if (region_ != nullptr) sender_->ReturnRevokedRegion(std::move(region_));
  }
  // Back to the pool while D reads the chunk in place: reused only once D
  // released it (its ack word holds `tag`; ucx_in_place_ack.h).
  void ReleaseWhileRead(uint64_t tag) {
    if (region_ != nullptr) {
      sender_->ReturnRegionWhileRead(std::move(region_), ack_word(), tag);
    }
  }

 protected:
  // A chunk left in place (shared memory D maps) is written the way that
  // hands it over to D fastest now (the sender's measurements); one sent
  // as a message keeps ordinary stores.
  AdaptiveStores* store_chooser() override {
    return region_ != nullptr && !region_->packed_rkey().empty()
               ? sender_->in_place_stores()
               : nullptr;
  }

 private:
  UcxKvSender* const sender_;
  std::unique_ptr<UcxRegion> region_;
  const int64_t size_;
};

// Opens one push to `target` over UCX (sends the header on its Push call):
// chunks go in place when `in_place` (D maps this worker's buffers), else as
// tagged messages from their buffer or from `ring` (kSlots slots of
// `slot_bytes`), over `connection`.
absl::StatusOr<std::unique_ptr<KvPushStream>> OpenUcxPushStream(
    UcxKvSender* sender, const std::string& target, const pb::KvHeader& header,
    absl::Time deadline, int64_t slot_bytes, std::unique_ptr<UcxRegion> ring,
    std::unique_ptr<UcxConnection> connection, bool in_place);

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_UCX_KV_PUSH_STREAM_H_
