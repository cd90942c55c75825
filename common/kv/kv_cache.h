// Paged KV cache: a fixed pool of blocks (block_size tokens x all layers x K
// and V) carved once from a byte budget, per-sequence block tables, explicit
// free, per-layer export/import of a sequence's KV as contiguous bytes (the KV
// wire layout), and a prefix cache of full blocks (ref-counted, shared
// read-only, LRU-evicted once unreferenced). Not thread-safe: the engine's
// driving thread owns it.
//
// Block states: a block is IN USE while at least one live sequence references
// it; otherwise it is FREE, either blank (free list) or CACHED (it holds a
// registered full prefix block and sits in the LRU, evictable). free_blocks()
// counts both kinds of free blocks: a leak check asserts
// free_blocks() == total_blocks() (equivalently used_blocks() == 0).
#ifndef PDSERVE_COMMON_KV_KV_CACHE_H_
#define PDSERVE_COMMON_KV_KV_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/kv/kv_tile_copy.h"
#include "common/kv/prefix_hash.h"
#include "common/model/dtype.h"
#include "common/util/checksum.h"

namespace pdserve {

using SeqId = int64_t;

// Prefix-cache counters (cumulative, except the two block gauges).
struct PrefixCacheStats {
  int64_t queries = 0;           // AttachPrefix calls
  int64_t query_tokens = 0;      // tokens offered to AttachPrefix
  int64_t hit_tokens = 0;        // tokens whose KV came from cached blocks
  int64_t evictions = 0;         // cached blocks reclaimed for new data
  int64_t cached_blocks = 0;     // blocks holding a registered prefix now
  int64_t evictable_blocks = 0;  // of those, unreferenced (in the LRU)
};

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

// OK when one request of `tokens` tokens fits a whole pool of `total_blocks`
// blocks of `block_size` positions; else OUT_OF_RANGE saying what to change,
// `pool` naming the pool ("this worker's", "the largest decode worker's").
// The one rule workers (Engine::CheckFitsPool) and the router apply.
absl::Status CheckRequestFitsPool(int64_t tokens, int block_size,
                                  int64_t total_blocks, absl::string_view pool);

class KvCache {
 public:
  // Carves floor(budget_bytes / BytesPerBlock) blocks; the memory is mapped
  // once and never grows. It is on huge pages where the kernel has them
  // (common/util/huge_pages.h) and then resident from the start; with
  // PDSERVE_HUGE_PAGES=0, pages become resident as blocks are first written.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvLayout& layout,
                                                         int64_t budget_bytes);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t total_blocks() const { return num_blocks_; }
  // Blank plus cached-but-unreferenced blocks: what Reserve can hand out.
  int64_t free_blocks() const {
    return static_cast<int64_t>(free_list_.size() + lru_.size());
  }
  // Blocks referenced by at least one live sequence.
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  // Blocks needed to hold `tokens` tokens.
  int64_t BlocksFor(int64_t tokens) const;

  SeqId CreateSequence();
  bool Contains(SeqId seq) const { return seqs_.count(seq) > 0; }
  // Grows the sequence's capacity to at least total_tokens (all or nothing);
  // RESOURCE_EXHAUSTED when the pool lacks free blocks. Blank blocks are used
  // first, then the least recently used cached ones are evicted.
  absl::Status Reserve(SeqId seq, int total_tokens);
  int Length(SeqId seq) const;    // -1 for an unknown sequence
  int Capacity(SeqId seq) const;  // -1 for an unknown sequence
  // <= capacity. Shrinking into a block shared with another sequence is
  // FAILED_PRECONDITION (cached blocks are immutable); shrinking into a
  // registered block of this sequence alone unregisters it.
  absl::Status SetLength(SeqId seq, int length);
  // Drops the sequence's references; its registered blocks stay cached
  // (evictable) once no sequence references them. Idempotent.
  void Free(SeqId seq);

  // ---- Prefix cache (no-ops until EnablePrefixCache).
  void EnablePrefixCache(const BlockHash& root);
  bool prefix_cache_enabled() const { return prefix_enabled_; }
  const BlockHash& prefix_root() const { return prefix_root_; }
  // For an empty sequence (no blocks): shares the longest run of cached full
  // blocks matching tokens[0, max_tokens) and sets the length to the tokens
  // covered, which it returns (0 on a miss or when disabled).
  absl::StatusOr<int> AttachPrefix(SeqId seq, absl::Span<const int32_t> tokens,
                                   int max_tokens);
  // Records the token ids at positions [start, start + n) of `seq` (whose KV
  // is written) and registers every block that became full: afterwards a
  // matching prompt can attach it. A gap (start beyond the tokens recorded)
  // stops tracking the sequence; overwriting positions truncates the record.
  absl::Status RecordTokens(SeqId seq, int start,
                            absl::Span<const int32_t> tokens);
  PrefixCacheStats prefix_stats() const;

  // The block table of a sequence (block ids in position order), or nullptr.
  const std::vector<int32_t>* BlockTable(SeqId seq) const;

  // In-pool layout, private to the pool and the CPU attention kernels (the
  // wire layout is token-major, see ExportLayer): memory is
  // [layer][kv_head][block][K|V][tile], the K tile TRANSPOSED
  // ([head_dim][block_size]: one dimension of 16 consecutive positions is
  // one vector) and the V tile [block_size][head_dim], so that one head's K
  // and V of one block are adjacent and the blocks of a sequence with
  // consecutive ids form one stream per layer and head.
  char* KeyTile(int32_t block, int layer, int kv_head) const {
    return Tile(block, layer, 0, kv_head);
  }
  char* ValueTile(int32_t block, int layer, int kv_head) const {
    return Tile(block, layer, 1, kv_head);
  }
  // The tiles' shape (kv_tile_copy.h).
  kv_internal::TileGeometry Geometry() const;
  // Bytes of one token's K (or V) row in the wire layout:
  // kv_heads * head_dim * sizeof(dtype).
  int64_t row_bytes() const { return row_bytes_; }
  // One token's K (kv = 0) or V (kv = 1) row, [kv_heads][head_dim] in the KV
  // dtype (the wire layout), at `offset` of physical block `block`.
  void WriteBlockRow(int32_t block, int layer, int kv, int offset,
                     const char* row);
  void ReadBlockRow(int32_t block, int layer, int kv, int offset,
                    char* row) const;
  // The same by position (< capacity) through a block table or a sequence.
  void WriteRowAt(const std::vector<int32_t>& table, int layer, int kv, int pos,
                  const char* row);
  // Rows of positions [pos, pos + n) (< capacity; consecutive rows,
  // row_bytes() apart), block by block: whole blocks take the fast
  // transposes of kv_tile_copy.h.
  // `hash` (optional) takes the rows' bytes in order, each block's right
  // after they were read. `stores`: kv_tile_copy.h.
  void WriteRowsAt(const std::vector<int32_t>& table, int layer, int kv,
                   int pos, int n, const char* rows, Xxh3Stream* hash = nullptr,
                   Stores stores = Stores::kCached);
  void ReadRowAt(const std::vector<int32_t>& table, int layer, int kv, int pos,
                 char* row) const;
  void WriteRow(SeqId seq, int layer, int kv, int pos, const char* row) {
    WriteRowAt(*BlockTable(seq), layer, kv, pos, row);
  }
  void ReadRow(SeqId seq, int layer, int kv, int pos, char* row) const {
    ReadRowAt(*BlockTable(seq), layer, kv, pos, row);
  }

  // Wire layout, tokens [begin, end) of one layer: K bytes
  // then V bytes, each [tokens][kv_heads][head_dim] in the KV dtype,
  // whatever the pool's block size and in-pool layout. `xxh3` (optional):
  // set to KvChecksum of the bytes, hashed block by block as they are
  // written (in cache: no pass of its own).
  absl::Status ExportLayer(SeqId seq, int layer, int begin, int end,
                           std::string* out, uint64_t* xxh3 = nullptr) const;
  // The same into `out`, which must be exactly 2 * (end - begin) *
  // row_bytes() long (INVALID_ARGUMENT otherwise): memory the caller
  // provides, e.g. registered with the KV transport. Stores::kStreaming
  // writes `out` with non-temporal stores (fenced before the return), each
  // block's rows staged (and hashed) in cache on the way; the bytes are the
  // same.
  absl::Status ExportLayer(SeqId seq, int layer, int begin, int end,
                           absl::Span<char> out, uint64_t* xxh3 = nullptr,
                           Stores stores = Stores::kCached) const;
  // Writes the same layout; capacity must cover `end` (call Reserve first);
  // FAILED_PRECONDITION for a range touching a registered (immutable) block.
  // `xxh3` (optional): set to KvChecksum of `bytes`, hashed block by block
  // as they are read (a caller verifying a pushed chunk this way imports
  // before it knows: the bytes land only in blocks of the sequence being
  // imported, which it frees on a mismatch).
  absl::Status ImportLayer(SeqId seq, int layer, int begin, int end,
                           absl::string_view bytes, uint64_t* xxh3 = nullptr);
  // How an import of `bytes` writes the pool: with non-temporal stores
  // from kStreamingImportMinBytes up (a long prompt's KV, which will not
  // fit in cache anyway: measured in docs/performance.md, "KV transfer"),
  // else ordinary ones. PDSERVE_KV_STREAMING_IMPORT=0/1 forces either (for
  // A/B runs).
  static Stores ImportStores(int64_t bytes);
  static constexpr int64_t kStreamingImportMinBytes = int64_t{1} << 20;

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int length = 0;
    // Prefix-cache tracking: token ids of positions [0, tokens.size()) and
    // the chained hashes of the first hashes.size() full blocks.
    bool tracked = true;
    std::vector<int32_t> tokens;
    std::vector<BlockHash> hashes;
  };
  // Per physical block.
  struct BlockInfo {
    int32_t refs = 0;
    bool hashed = false;  // registered in cached_
    BlockHash hash;
    std::list<int32_t>::iterator lru_pos;  // valid when refs == 0 && hashed
  };
  KvCache(const KvLayout& layout, int64_t num_blocks, char* base,
          int64_t mapped_bytes);
  // Takes a blank block, else evicts the LRU cached one; refs becomes 1.
  int32_t AllocateBlock();
  void ReleaseBlock(int32_t block);
  void Unregister(int32_t block);
  // Registers the sequence's blocks that its recorded tokens fill.
  void RegisterFullBlocks(Sequence& s);
  char* Tile(int32_t block, int layer, int kv, int kv_head) const {
    return base_ +
           (((int64_t{layer} * layout_.num_kv_heads + kv_head) * num_blocks_ +
             block) *
                2 +
            kv) *
               tile_bytes_;
  }

  KvLayout layout_;
  int64_t num_blocks_;
  char* base_;
  int64_t mapped_bytes_;
  int64_t row_bytes_;               // kv_heads * head_dim * dtype size
  int64_t tile_bytes_;              // block_size * head_dim * dtype size
  std::vector<int32_t> free_list_;  // blank blocks
  std::vector<BlockInfo> info_;
  std::list<int32_t> lru_;  // cached, unreferenced: front = evicted first
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;
  bool prefix_enabled_ = false;
  BlockHash prefix_root_;
  PrefixCacheStats stats_;
  std::unordered_map<SeqId, Sequence> seqs_;
  SeqId next_seq_ = 1;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KV_KV_CACHE_H_
