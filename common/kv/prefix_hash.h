// Chained hashes of full KV blocks for prefix caching and prefix-aware
// routing: block i's hash covers (model fingerprint, KV dtype, block size, all
// tokens up to the end of block i), computed as XXH3-128(previous block's
// hash, this block's tokens). Pure functions: thread-safe.
#ifndef PDSERVE_COMMON_KV_PREFIX_HASH_H_
#define PDSERVE_COMMON_KV_PREFIX_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/model/dtype.h"

namespace pdserve {

struct BlockHash {
  uint64_t high = 0;
  uint64_t low = 0;
  bool operator==(const BlockHash& o) const {
    return high == o.high && low == o.low;
  }
  bool operator!=(const BlockHash& o) const { return !(*this == o); }
  std::string ToHex() const;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    return static_cast<size_t>(h.low ^ (h.high * 0x9e3779b97f4a7c15ULL));
  }
};

// The chain's seed: what makes equal tokens of different models (or KV
// dtypes, or block sizes) hash differently.
BlockHash PrefixHashRoot(absl::string_view model_fingerprint, DType kv_dtype,
                         int block_size);
// Hash of one block given the hash of the block before it (or the root).
BlockHash ChainBlockHash(const BlockHash& previous,
                         absl::Span<const int32_t> block_tokens);
// Hashes of the first min(max_blocks, tokens.size() / block_size) FULL
// blocks of `tokens` (max_blocks < 0: all of them).
std::vector<BlockHash> FullBlockHashes(const BlockHash& root,
                                       absl::Span<const int32_t> tokens,
                                       int block_size, int max_blocks = -1);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KV_PREFIX_HASH_H_
