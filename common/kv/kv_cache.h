// Paged KV cache: a fixed pool of blocks (block_size tokens x all layers x K
// and V) carved once from a byte budget, per-sequence block tables, explicit
// free, and per-layer export/import of a sequence's KV as contiguous bytes
// (the KV wire layout). Not thread-safe: the engine's driving thread owns it.
#ifndef PDSERVE_COMMON_KV_KV_CACHE_H_
#define PDSERVE_COMMON_KV_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/dtype.h"

namespace pdserve {

using SeqId = int64_t;

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  DType dtype = DType::kF32;
  // 2 (K and V) * kv_heads * head_dim * sizeof(dtype).
  int64_t BytesPerTokenPerLayer() const;
  int64_t BytesPerBlock() const;  // all layers, K and V
};

class KvCache {
 public:
  // Carves floor(budget_bytes / BytesPerBlock) blocks; the memory is mapped
  // once and never grows (pages become resident as blocks are first written).
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvLayout& layout,
                                                         int64_t budget_bytes);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t total_blocks() const { return num_blocks_; }
  int64_t free_blocks() const {
    return static_cast<int64_t>(free_list_.size());
  }
  // Blocks needed to hold `tokens` tokens.
  int64_t BlocksFor(int64_t tokens) const;

  SeqId CreateSequence();
  bool Contains(SeqId seq) const { return seqs_.count(seq) > 0; }
  // Grows the sequence's capacity to at least total_tokens (all or nothing);
  // RESOURCE_EXHAUSTED when the pool lacks free blocks.
  absl::Status Reserve(SeqId seq, int total_tokens);
  int Length(SeqId seq) const;                    // -1 for an unknown sequence
  int Capacity(SeqId seq) const;                  // -1 for an unknown sequence
  absl::Status SetLength(SeqId seq, int length);  // <= capacity
  void Free(SeqId seq);                           // idempotent

  // Address of the K (or V) vector row [kv_heads * head_dim] of token `pos`
  // of `seq` in `layer`; pos must be < capacity. For the kernels.
  char* KeyRow(SeqId seq, int layer, int pos);
  char* ValueRow(SeqId seq, int layer, int pos);
  const char* KeyRow(SeqId seq, int layer, int pos) const;
  const char* ValueRow(SeqId seq, int layer, int pos) const;
  // The block table of a sequence (block ids in position order), or nullptr.
  const std::vector<int32_t>* BlockTable(SeqId seq) const;
  // Row address from a block table (hot path: no map lookup).
  char* KeyRowAt(const std::vector<int32_t>& table, int layer, int pos) const;
  char* ValueRowAt(const std::vector<int32_t>& table, int layer, int pos) const;

  // Row `offset` of K (kv = 0) or V (kv = 1) in physical block `block` of
  // `layer`; rows of one block are row_bytes() apart (kernels walk blocks).
  char* BlockRow(int32_t block, int layer, int kv, int offset) const {
    return base_ + (((int64_t{block} * layout_.num_layers + layer) * 2 + kv) *
                        layout_.block_size +
                    offset) *
                       row_bytes_;
  }
  int64_t row_bytes() const { return row_bytes_; }

  // Wire layout, tokens [begin, end) of one layer: K bytes then V bytes, each
  // [tokens][kv_heads][head_dim] in the KV dtype.
  absl::Status ExportLayer(SeqId seq, int layer, int begin, int end,
                           std::string* out) const;
  // Writes the same layout; capacity must cover `end` (call Reserve first).
  absl::Status ImportLayer(SeqId seq, int layer, int begin, int end,
                           absl::string_view bytes);

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int length = 0;
  };
  KvCache(const KvLayout& layout, int64_t num_blocks, char* base,
          int64_t mapped_bytes);
  char* Row(const std::vector<int32_t>& table, int layer, int pos,
            int kv) const;

  KvLayout layout_;
  int64_t num_blocks_;
  char* base_;
  int64_t mapped_bytes_;
  int64_t row_bytes_;  // kv_heads * head_dim * dtype size
  std::vector<int32_t> free_list_;
  std::unordered_map<SeqId, Sequence> seqs_;
  SeqId next_seq_ = 1;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KV_KV_CACHE_H_
