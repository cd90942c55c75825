#include "common/transport/kv_wire.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/checksum.h"

namespace pdserve::transport {

uint64_t KvChecksum(absl::string_view data) {
  return Xxh3(data.data(), data.size());
}

void SealChunk(pb::KvChunk* chunk) {
  chunk->set_xxh3(KvChecksum(chunk->data()));
}

pb::KvLayoutProto LayoutToProto(const KvLayout& layout) {
  pb::KvLayoutProto p;
  p.set_num_layers(layout.num_layers);
  p.set_num_kv_heads(layout.num_kv_heads);
  p.set_head_dim(layout.head_dim);
  p.set_block_size(layout.block_size);
  p.set_dtype(DTypeName(layout.dtype));
  return p;
}

absl::StatusOr<KvLayout> LayoutFromProto(const pb::KvLayoutProto& proto) {
  KvLayout l;
  l.num_layers = proto.num_layers();
  l.num_kv_heads = proto.num_kv_heads();
  l.head_dim = proto.head_dim();
  l.block_size = proto.block_size();
  if (l.num_layers <= 0 || l.num_kv_heads <= 0 || l.head_dim <= 0 ||
      l.block_size <= 0 || l.num_layers > 4096 || l.num_kv_heads > 4096 ||
      l.head_dim > 65536) {
    return absl::InvalidArgumentError("KV header: malformed layout");
  }
  auto dtype = ParseComputeDType(proto.dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV header: unknown dtype '", proto.dtype(), "'"));
  }
  l.dtype = *dtype;
  return l;
}

std::vector<std::pair<int, int>> ChunkTokenRanges(int begin, int end,
                                                  int64_t bytes_per_token,
                                                  int64_t target_bytes) {
  std::vector<std::pair<int, int>> out;
  const int64_t per_chunk = std::max<int64_t>(
      1, target_bytes / std::max<int64_t>(1, bytes_per_token));
  for (int b = begin; b < end;) {
    int e = static_cast<int>(std::min<int64_t>(end, b + per_chunk));
    out.emplace_back(b, e);
    b = e;
  }
  return out;
}

int64_t MaxChunkBytes(int num_tokens, int64_t bytes_per_token,
                      int64_t target_bytes) {
  const int64_t bpt = std::max<int64_t>(1, bytes_per_token);
  const int64_t per_chunk = std::max<int64_t>(1, target_bytes / bpt);
  const int64_t tokens =
      std::max<int64_t>(1, std::min<int64_t>(per_chunk, num_tokens));
  return (tokens * bpt + 63) / 64 * 64;
}

const char* KvHeaderTransport(const pb::KvHeader& header) {
  if (header.has_ucx()) return "ucx";
  return "grpc";
}

absl::Status CheckHeaderCompatible(const pb::KvHeader& header,
                                   absl::string_view local_fingerprint,
                                   const KvLayout& local_layout) {
  if (header.request_id().empty()) {
    return absl::InvalidArgumentError("KV header: empty request id");
  }
  if (header.num_tokens() <= 0) {
    return absl::InvalidArgumentError("KV header: no tokens");
  }
  if (header.model_fingerprint() != local_fingerprint) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV cache is from a different model or numerics "
                     "(fingerprint ",
                     header.model_fingerprint(), ", this decode worker serves ",
                     local_fingerprint,
                     "): give prefill and decode workers the same --model, "
                     "--dtype, --quantization and PDSERVE_BF16_KERNEL"));
  }
  auto layout = LayoutFromProto(header.layout());
  if (!layout.ok()) return layout.status();
  if (layout->num_layers != local_layout.num_layers ||
      layout->num_kv_heads != local_layout.num_kv_heads ||
      layout->head_dim != local_layout.head_dim ||
      layout->dtype != local_layout.dtype) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV layout mismatch: got ", layout->num_layers, " layers x ",
        layout->num_kv_heads, " kv heads x ", layout->head_dim, " ",
        DTypeName(layout->dtype), ", expected ", local_layout.num_layers, " x ",
        local_layout.num_kv_heads, " x ", local_layout.head_dim, " ",
        DTypeName(local_layout.dtype)));
  }
  return absl::OkStatus();
}

KvCoverage::KvCoverage(const KvLayout& layout, int num_tokens)
    : layout_(layout),
      num_tokens_(num_tokens),
      next_token_(layout.num_layers, 0) {}

int64_t KvCoverage::expected_bytes() const {
  return layout_.BytesPerTokenPerLayer() * num_tokens_ * layout_.num_layers;
}

absl::Status KvCoverage::VerifyChecksum(const KvChunkView& chunk,
                                        uint64_t computed) {
  if (computed == chunk.xxh3) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "KV chunk checksum mismatch (layer ", chunk.layer, ", tokens [",
      chunk.token_begin, ", ", chunk.token_end, "))"));
}

absl::Status KvCoverage::Accept(const KvChunkView& chunk,
                                bool verify_checksum) {
  if (chunk.layer < 0 || chunk.layer >= layout_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV chunk: layer ", chunk.layer, " out of range"));
  }
  int& next = next_token_[chunk.layer];
  if (chunk.token_begin != next || chunk.token_end <= chunk.token_begin ||
      chunk.token_end > num_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunk: layer ", chunk.layer, " tokens [", chunk.token_begin, ", ",
        chunk.token_end, ") out of order (expected from ", next, " up to ",
        num_tokens_, ")"));
  }
  const int64_t want =
      layout_.BytesPerTokenPerLayer() * (chunk.token_end - chunk.token_begin);
  if (static_cast<int64_t>(chunk.data.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunk: ", chunk.data.size(), " bytes, expected ", want));
  }
  if (verify_checksum) {
    if (absl::Status s = VerifyChecksum(chunk, KvChecksum(chunk.data));
        !s.ok()) {
      return s;
    }
  }
  next = chunk.token_end;
  if (next == num_tokens_) ++complete_layers_;
  bytes_ += want;
  return absl::OkStatus();
}

}  // namespace pdserve::transport
