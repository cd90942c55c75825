#include "common/kv/prefix_hash.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pdserve {

std::string BlockHash::ToHex() const {
  return absl::StrFormat("%016x%016x", high, low);
}

BlockHash PrefixHashRoot(absl::string_view model_fingerprint, DType kv_dtype,
                         int block_size) {
  const std::string seed =
      absl::StrCat("pdserve-prefix-v1:", model_fingerprint, ":",
                   DTypeName(kv_dtype), ":", block_size);
  const XXH128_hash_t h = XXH3_128bits(seed.data(), seed.size());
  return {h.high64, h.low64};
}

BlockHash ChainBlockHash(const BlockHash& previous,
                         absl::Span<const int32_t> block_tokens) {
  // One contiguous buffer: [previous hash (16 bytes)][tokens].
  std::string buf(16 + block_tokens.size() * sizeof(int32_t), '\0');
  std::memcpy(buf.data(), &previous.high, 8);
  std::memcpy(buf.data() + 8, &previous.low, 8);
  std::memcpy(buf.data() + 16, block_tokens.data(),
              block_tokens.size() * sizeof(int32_t));
  const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  return {h.high64, h.low64};
}

std::vector<BlockHash> FullBlockHashes(const BlockHash& root,
                                       absl::Span<const int32_t> tokens,
                                       int block_size, int max_blocks) {
  std::vector<BlockHash> out;
  if (block_size <= 0) return out;
  size_t n = tokens.size() / block_size;
  if (max_blocks >= 0) n = std::min(n, static_cast<size_t>(max_blocks));
  out.reserve(n);
  BlockHash h = root;
  for (size_t i = 0; i < n; ++i) {
    h = ChainBlockHash(h, tokens.subspan(i * block_size, block_size));
    out.push_back(h);
  }
  return out;
}

}  // namespace pdserve
