#include "common/backend/cpu/attention_pass.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "common/backend/cpu/attention.h"

namespace pdserve {

AttentionPass::AttentionPass(int num_heads, int num_kv_heads, int head_dim)
    : num_heads_(num_heads),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      tile_rows_(std::clamp(AttentionTileQueries(head_dim) /
                                std::max(1, num_heads / num_kv_heads),
                            1, kMaxTileRows)) {}

void AttentionPass::Clear() {
  tiles_.clear();
  units_.clear();
  split_ = false;
}

void AttentionPass::AddSequence(const std::vector<int32_t>* table, int64_t row0,
                                int start_pos, int n) {
  for (int t = 0; t < n; t += tile_rows_) {
    const int rows = std::min(tile_rows_, n - t);
    const int last = start_pos + t + rows - 1;
    tiles_.push_back(
        {table, row0 + t, start_pos + t, rows, AttentionPartitionOf(last) + 1});
  }
}

void AttentionPass::Plan(int threads) {
  const int64_t base_units =
      static_cast<int64_t>(tiles_.size()) * num_kv_heads_;
  // Split contexts only when tiles x kv heads leave threads idle: into
  // `chunks` ranges of partitions per tile.
  int chunks = 1;
  const int64_t want = int64_t{kUnitsPerThread} * threads;
  if (threads > 1 && base_units > 0 && base_units < want) {
    chunks = static_cast<int>((want + base_units - 1) / base_units);
  }
  const int stride = AttentionPartialFloats(head_dim_);
  int64_t partial_floats = 0;
  split_ = false;
  for (Tile& tile : tiles_) {
    tile.partials = -1;
    if (chunks > 1 && tile.parts > 1) {
      tile.partials = partial_floats;
      partial_floats += int64_t{tile.rows} * num_heads_ * tile.parts * stride;
      split_ = true;
    }
  }
  if (static_cast<int64_t>(partials_.size()) < partial_floats) {
    partials_.resize(partial_floats);
  }
  // Head major, so that consecutive units reuse a head's K and V from cache.
  units_.clear();
  for (int h = 0; h < num_kv_heads_; ++h) {
    for (size_t t = 0; t < tiles_.size(); ++t) {
      const Tile& tile = tiles_[t];
      const int per =
          tile.partials < 0 ? tile.parts : (tile.parts + chunks - 1) / chunks;
      for (int p = 0; p < tile.parts; p += per) {
        units_.push_back(
            {static_cast<int32_t>(t), h, p, std::min(tile.parts, p + per)});
      }
    }
  }
}

void AttentionPass::Run(ThreadPool& pool, const KvCache& kv, int layer,
                        int window, const float* qkv, int64_t ld_qkv,
                        float* attn, int64_t ld_attn) {
  const int D = head_dim_;
  const int group = num_heads_ / num_kv_heads_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int stride = AttentionPartialFloats(D);
  // Query head h of row g of a tile, and where its partials go.
  auto query = [&](const Tile& tile, int g, int h) {
    const int64_t r = tile.row0 + g;
    const int pos = tile.pos0 + g;
    AttentionQuery q;
    q.q = qkv + r * ld_qkv + int64_t{h} * D;
    q.last = pos;
    q.first = window > 0 ? std::max(0, pos - window + 1) : 0;
    q.out = attn + r * ld_attn + int64_t{h} * D;
    return q;
  };
  auto partials = [&](const Tile& tile, int g, int h) {
    return partials_.data() + tile.partials +
           (int64_t{g} * num_heads_ + h) * tile.parts * stride;
  };
  const int64_t num_units = static_cast<int64_t>(units_.size());
  // Threads take units from a shared counter: which thread computes a unit
  // never changes its bits.
  std::atomic<int64_t> next{0};
  pool.ParallelFor(
      std::min<int64_t>(num_units, pool.num_threads()),
      [&](int64_t, int64_t, int) {
        thread_local std::vector<AttentionQuery> queries;
        thread_local std::vector<float*> outs;
        for (int64_t u = next.fetch_add(1, std::memory_order_relaxed);
             u < num_units; u = next.fetch_add(1, std::memory_order_relaxed)) {
          const Unit& unit = units_[u];
          const Tile& tile = tiles_[unit.tile];
          const AttentionArgs args{&kv,          tile.table, layer,
                                   unit.kv_head, D,          scale};
          queries.clear();
          outs.clear();
          for (int g = 0; g < tile.rows; ++g) {
            for (int h = unit.kv_head * group; h < (unit.kv_head + 1) * group;
                 ++h) {
              queries.push_back(query(tile, g, h));
              if (tile.partials >= 0) outs.push_back(partials(tile, g, h));
            }
          }
          const int n = static_cast<int>(queries.size());
          if (tile.partials < 0) {
            AttendHeads(args, queries.data(), n);
          } else {
            AttendPartitions(args, queries.data(), outs.data(), n,
                             unit.part_begin, unit.part_end);
          }
        }
      });
  if (!split_) return;
  // Split tiles: every query's partitions combined in order.
  const int64_t combines = static_cast<int64_t>(tiles_.size()) * num_heads_;
  pool.ParallelFor(combines, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const Tile& tile = tiles_[i / num_heads_];
      const int h = static_cast<int>(i % num_heads_);
      if (tile.partials < 0) continue;
      for (int g = 0; g < tile.rows; ++g) {
        CombineAttention(query(tile, g, h), D, partials(tile, g, h));
      }
    }
  });
}

}  // namespace pdserve
