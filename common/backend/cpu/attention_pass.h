// The attention of one forward pass over the paged KV cache: groups each
// sequence's rows into tiles (rows whose query heads of one kv head share K
// and V loads), plans the work units (a tile x a kv head, or x a range of
// context partitions when those are too few to keep every thread busy) and
// runs them on the thread pool. The plan never changes a bit (attention.h).
// Not thread-safe: the runner's driving thread owns it.
#ifndef PDSERVE_COMMON_BACKEND_CPU_ATTENTION_PASS_H_
#define PDSERVE_COMMON_BACKEND_CPU_ATTENTION_PASS_H_

#include <cstdint>
#include <vector>

#include "common/backend/thread_pool.h"
#include "common/kv/kv_cache.h"

namespace pdserve {

class AttentionPass {
 public:
  AttentionPass(int num_heads, int num_kv_heads, int head_dim);

  // Starts a pass with no rows.
  void Clear();
  // Rows [row0, row0 + n) of the pass are positions [start_pos, start_pos +
  // n) of the sequence whose block table is `table`.
  void AddSequence(const std::vector<int32_t>* table, int64_t row0,
                   int start_pos, int n);
  // Plans the work units for `threads` threads (after the last AddSequence).
  void Plan(int threads);
  // attn[r * ld_attn + h * head_dim ...] = attention of row r's query head h
  // (q at qkv[r * ld_qkv + h * head_dim]) over positions [pos - window + 1,
  // pos] (window 0: [0, pos]) of its sequence in `layer`.
  void Run(ThreadPool& pool, const KvCache& kv, int layer, int window,
           const float* qkv, int64_t ld_qkv, float* attn, int64_t ld_attn);

 private:
  struct Tile {
    const std::vector<int32_t>* table;
    int64_t row0;
    int pos0;  // position of row0
    int rows;
    int parts;              // context partitions of its last row
    int64_t partials = -1;  // offset in partials_ when its context is split
  };
  struct Unit {
    int32_t tile;
    int32_t kv_head;
    int32_t part_begin;
    int32_t part_end;
  };
  // Attention units per thread below which contexts are split.
  static constexpr int kUnitsPerThread = 4;
  static constexpr int kMaxTileRows = 8;

  const int num_heads_, num_kv_heads_, head_dim_;
  int tile_rows_;
  std::vector<Tile> tiles_;
  std::vector<Unit> units_;
  std::vector<float> partials_;
  bool split_ = false;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_ATTENTION_PASS_H_
