// Copies between the KV pool's tiles and token-major rows (the wire layout):
// KvCache keeps, per block, layer, K|V and kv head, one tile, the K tile
// TRANSPOSED ([head_dim][block_size]) and the V tile [block_size][head_dim]
// (kv_cache.h); a row is one token's [kv_heads][head_dim]. Whole blocks of
// 16 tokens transpose 16 x 16 at a time (K) and copy a cache line at a time
// (V, where a head's slice is whole lines) with AVX-512 where the CPU has it
// (export and import of a pushed prompt's KV run at memory speed instead of
// one element at a time; AVX2 CPUs transpose 8 x 8). Pure data movement:
// every element lands bit for bit. Stateless, thread-compatible.
#ifndef PDSERVE_COMMON_KV_KV_TILE_COPY_H_
#define PDSERVE_COMMON_KV_KV_TILE_COPY_H_

#include <cstdint>

#include "common/util/streaming_copy.h"

namespace pdserve::kv_internal {

struct TileGeometry {
  int64_t tile_bytes;   // one head's tile
  int64_t head_stride;  // from one kv head's tile to the next one's
  int kv_heads, head_dim, block_size;
  int elem_bytes;  // 2 (bf16) or 4 (f32)
  int64_t row_bytes() const {
    return int64_t{kv_heads} * head_dim * elem_bytes;
  }
};

// Rows of block offsets [o0, o1) (consecutive, row_bytes() apart, the first
// at `rows`) into one block's tiles of one layer (K: transposed) and back.
// `tiles` is the kv head 0 tile; the others follow head_stride apart.
// Stores::kStreaming (streaming_copy.h) writes whole blocks with
// non-temporal stores where the CPU and the alignment allow (ordinary
// stores otherwise), unfenced: the caller ends its run of them with
// StreamingFence before the tiles are published to other threads.
void RowsToTiles(const TileGeometry& g, bool transposed, int o0, int o1,
                 const char* rows, char* tiles,
                 Stores stores = Stores::kCached);
void TilesToRows(const TileGeometry& g, bool transposed, const char* tiles,
                 int o0, int o1, char* rows);

// Whether whole blocks take a vector path (AVX-512, else AVX2) on this CPU
// (for the tests).
bool TileCopyVectorized(const TileGeometry& g);

}  // namespace pdserve::kv_internal

#endif  // PDSERVE_COMMON_KV_KV_TILE_COPY_H_
