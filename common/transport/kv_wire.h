// The KV wire format shared by every transport: layout <-> proto, checksums
// (XXH3-64 per chunk), how a layer is cut into chunks, the checks a receiver
// runs on a header (same model and layout) and on each chunk (in range, right
// size, checksum), and KvCoverage, which tracks when a push is complete.
// Free functions are thread-safe; KvCoverage is thread-compatible.
#ifndef PDSERVE_COMMON_TRANSPORT_KV_WIRE_H_
#define PDSERVE_COMMON_TRANSPORT_KV_WIRE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/kv/kv_cache.h"
#include "pdserve/v1/worker.pb.h"

namespace pdserve::transport {

namespace pb = ::pdserve::v1::internal;

// A layer's KV for many tokens is cut into chunks of at most this many bytes
// (always whole tokens), so chunks stay far below the message-size limit.
inline constexpr int64_t kKvChunkTargetBytes = int64_t{4} << 20;

uint64_t KvChecksum(absl::string_view data);
// Sets chunk->xxh3 from chunk->data.
void SealChunk(pb::KvChunk* chunk);

pb::KvLayoutProto LayoutToProto(const KvLayout& layout);
absl::StatusOr<KvLayout> LayoutFromProto(const pb::KvLayoutProto& proto);

// Token ranges [b, e) covering [begin, end) with at most `target_bytes`
// bytes each (at least one token per range).
std::vector<std::pair<int, int>> ChunkTokenRanges(int begin, int end,
                                                  int64_t bytes_per_token,
                                                  int64_t target_bytes);

// The largest chunk ChunkTokenRanges cuts from a push of `num_tokens`
// tokens (what a UCX slot or landing buffer must hold), rounded up to 64
// bytes: a short prompt's push needs small buffers, not target-sized ones.
int64_t MaxChunkBytes(int num_tokens, int64_t bytes_per_token,
                      int64_t target_bytes);

// How a push's bytes travel, from its header: "ucx" or "grpc".
const char* KvHeaderTransport(const pb::KvHeader& header);

// FAILED_PRECONDITION when the header's model fingerprint or layout differs
// from the receiver's; INVALID_ARGUMENT for a malformed header.
absl::Status CheckHeaderCompatible(const pb::KvHeader& header,
                                   absl::string_view local_fingerprint,
                                   const KvLayout& local_layout);

// One chunk with its bytes by reference: an inline KvChunk's or a range of a
// shared-memory segment. Valid while what it points into lives.
struct KvChunkView {
  int layer = 0;
  int token_begin = 0;
  int token_end = 0;
  absl::string_view data;
  uint64_t xxh3 = 0;
  static KvChunkView Of(const pb::KvChunk& chunk) {
    return {chunk.layer(), chunk.token_begin(), chunk.token_end(), chunk.data(),
            chunk.xxh3()};
  }
};

// Tracks, per layer, how many tokens arrived; chunks of a layer must arrive
// in token order without gaps or overlaps.
class KvCoverage {
 public:
  KvCoverage(const KvLayout& layout, int num_tokens);
  // INVALID_ARGUMENT for a chunk out of range/order or of the wrong size;
  // DATA_LOSS when its checksum does not match its bytes (checked unless
  // `verify_checksum` is false: the caller then compares a checksum it
  // computed on the way, see VerifyChecksum). Records it on OK.
  absl::Status Accept(const KvChunkView& chunk, bool verify_checksum = true);
  absl::Status Accept(const pb::KvChunk& chunk) {
    return Accept(KvChunkView::Of(chunk));
  }
  // DATA_LOSS unless `computed` (KvChecksum of chunk.data) is the chunk's.
  static absl::Status VerifyChecksum(const KvChunkView& chunk,
                                     uint64_t computed);
  bool complete() const { return complete_layers_ == layout_.num_layers; }
  int64_t bytes() const { return bytes_; }
  // Total bytes of a complete push.
  int64_t expected_bytes() const;

 private:
  KvLayout layout_;
  int num_tokens_;
  std::vector<int> next_token_;
  int complete_layers_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_KV_WIRE_H_
