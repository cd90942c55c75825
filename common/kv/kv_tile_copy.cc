#include "common/kv/kv_tile_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC 12 reports its own intrinsics' `__m512 __Y = __Y;` idiom as
// (maybe-)uninitialized once inlined (as in the attention kernels).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve::kv_internal {
namespace {

// One element at a time: any block size, partial blocks.
template <typename T>
void RowsToTilesScalar(const TileGeometry& g, bool transposed, int o0, int o1,
                       const char* rows, char* tiles) {
  const int64_t stride = g.row_bytes() / sizeof(T);
  const T* src = reinterpret_cast<const T*>(rows);
  for (int h = 0; h < g.kv_heads; ++h) {
    T* tile = reinterpret_cast<T*>(tiles + h * g.head_stride);
    for (int o = o0; o < o1; ++o) {
      const T* row = src + (o - o0) * stride + int64_t{h} * g.head_dim;
      if (!transposed) {
        std::memcpy(tile + int64_t{o} * g.head_dim, row,
                    sizeof(T) * g.head_dim);
        continue;
      }
      for (int d = 0; d < g.head_dim; ++d) {
        tile[int64_t{d} * g.block_size + o] = row[d];
      }
    }
  }
}

template <typename T>
void TilesToRowsScalar(const TileGeometry& g, bool transposed,
                       const char* tiles, int o0, int o1, char* rows) {
  const int64_t stride = g.row_bytes() / sizeof(T);
  T* dst = reinterpret_cast<T*>(rows);
  for (int h = 0; h < g.kv_heads; ++h) {
    const T* tile = reinterpret_cast<const T*>(tiles + h * g.head_stride);
    for (int o = o0; o < o1; ++o) {
      T* row = dst + (o - o0) * stride + int64_t{h} * g.head_dim;
      if (!transposed) {
        std::memcpy(row, tile + int64_t{o} * g.head_dim,
                    sizeof(T) * g.head_dim);
        continue;
      }
      for (int d = 0; d < g.head_dim; ++d) {
        row[d] = tile[int64_t{d} * g.block_size + o];
      }
    }
  }
}

#if defined(__x86_64__)
#define PDSERVE_TILE_AVX512 __attribute__((target("avx512f,avx512bw")))

// r[i][j] <- r[j][i] for 16 x 16 32-bit lanes.
PDSERVE_TILE_AVX512 inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] =
          _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// 16 elements (f32 or bf16 widened to 32-bit lanes) and back.
template <int kBytes>
PDSERVE_TILE_AVX512 inline __m512i Load16(const char* p) {
  if constexpr (kBytes == 4) {
    return _mm512_loadu_si512(p);
  } else {
    return _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}
// kStream: a non-temporal store (p aligned to the store's width).
template <int kBytes, bool kStream>
PDSERVE_TILE_AVX512 inline void Store16(char* p, __m512i v) {
  if constexpr (kBytes == 4) {
    if constexpr (kStream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
    } else {
      _mm512_storeu_si512(p, v);
    }
  } else {
    const __m256i h = _mm512_cvtepi32_epi16(v);
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
    }
  }
}

// A whole block of 16 tokens: K tiles [head_dim][16] <-> rows, 16
// dimensions at a time. kToTiles: `in` is rows and `out` tiles; else the
// reverse. kStream: non-temporal stores (tiles only).
template <int kBytes, bool kToTiles, bool kStream = false>
PDSERVE_TILE_AVX512 void BlockK16(const TileGeometry& g, const char* in,
                                  char* out) {
  const int64_t row_bytes = g.row_bytes();
  auto row_at = [&](int h, int i, int d0) {
    return (int64_t{h} * g.head_dim + d0) * kBytes + i * row_bytes;
  };
  auto tile_at = [&](int h, int i, int d0) {
    return h * g.head_stride + int64_t{d0 + i} * 16 * kBytes;
  };
  for (int h = 0; h < g.kv_heads; ++h) {
    for (int d0 = 0; d0 < g.head_dim; d0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = Load16<kBytes>(
            in + (kToTiles ? row_at(h, i, d0) : tile_at(h, i, d0)));
      }
      Transpose16x16(r);
      for (int i = 0; i < 16; ++i) {
        Store16<kBytes, kStream>(
            out + (kToTiles ? tile_at(h, i, d0) : row_at(h, i, d0)), r[i]);
      }
    }
  }
}

// A whole block of 16 tokens between V tiles [16][head_dim] and rows: each
// head's tile is 16 row slices back to back, copied a cache line at a time
// (slices are whole lines). kToTiles: `in` is rows and `out` tiles, else
// the reverse. kStream: non-temporal stores (tiles only).
template <bool kToTiles, bool kStream>
PDSERVE_TILE_AVX512 void BlockV16(const TileGeometry& g, const char* in,
                                  char* out) {
  const int64_t row_bytes = g.row_bytes();
  const int64_t slice = int64_t{g.head_dim} * g.elem_bytes;  // % 64 == 0
  for (int h = 0; h < g.kv_heads; ++h) {
    for (int i = 0; i < 16; ++i) {
      const int64_t row_at = i * row_bytes + h * slice;
      const int64_t tile_at = h * g.head_stride + i * slice;
      const char* from = in + (kToTiles ? row_at : tile_at);
      char* to = out + (kToTiles ? tile_at : row_at);
      for (int64_t at = 0; at < slice; at += 64) {
        const __m512i v = _mm512_loadu_si512(from + at);
        if constexpr (kStream) {
          _mm512_stream_si512(reinterpret_cast<__m512i*>(to + at), v);
        } else {
          _mm512_storeu_si512(to + at, v);
        }
      }
    }
  }
}

// Whether one head's slice of a row is whole cache lines (BlockV16).
bool WholeLineSlices(const TileGeometry& g) {
  return (int64_t{g.head_dim} * g.elem_bytes) % 64 == 0;
}

bool HasAvx512() {
  static const bool has =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has;
}

// Whether a whole block can be written with non-temporal stores: every
// store lands on its own width's alignment (tiles are 64-byte aligned in
// the pool) and V slices are whole cache lines.
bool WholeBlockStreams(const TileGeometry& g, bool transposed,
                       const char* tiles) {
  if (reinterpret_cast<uintptr_t>(tiles) % 64 != 0 || g.head_stride % 64 != 0)
    return false;
  return transposed || WholeLineSlices(g);
}

#endif  // __x86_64__

bool WholeBlockFast(const TileGeometry& g, int o0, int o1) {
  return TileCopyUsesAvx512(g) && o0 == 0 && o1 == 16;
}

}  // namespace

bool TileCopyUsesAvx512(const TileGeometry& g) {
#if defined(__x86_64__)
  return g.block_size == 16 && g.head_dim % 16 == 0 &&
         (g.elem_bytes == 2 || g.elem_bytes == 4) && HasAvx512();
#else
  (void)g;
  return false;
#endif
}

void RowsToTiles(const TileGeometry& g, bool transposed, int o0, int o1,
                 const char* rows, char* tiles, Stores stores) {
#if defined(__x86_64__)
  if (stores == Stores::kStreaming && WholeBlockFast(g, o0, o1) &&
      WholeBlockStreams(g, transposed, tiles)) {
    if (!transposed) {
      BlockV16<true, true>(g, rows, tiles);
    } else if (g.elem_bytes == 4) {
      BlockK16<4, true, true>(g, rows, tiles);
    } else {
      BlockK16<2, true, true>(g, rows, tiles);
    }
    return;
  }
  if (!transposed && WholeBlockFast(g, o0, o1) && WholeLineSlices(g)) {
    BlockV16<true, false>(g, rows, tiles);
    return;
  }
  if (transposed && WholeBlockFast(g, o0, o1)) {
    if (g.elem_bytes == 4) {
      BlockK16<4, true>(g, rows, tiles);
    } else {
      BlockK16<2, true>(g, rows, tiles);
    }
    return;
  }
#endif
  if (g.elem_bytes == 2) {
    RowsToTilesScalar<uint16_t>(g, transposed, o0, o1, rows, tiles);
  } else {
    RowsToTilesScalar<uint32_t>(g, transposed, o0, o1, rows, tiles);
  }
}

void TilesToRows(const TileGeometry& g, bool transposed, const char* tiles,
                 int o0, int o1, char* rows) {
#if defined(__x86_64__)
  if (!transposed && WholeBlockFast(g, o0, o1) && WholeLineSlices(g)) {
    BlockV16<false, false>(g, tiles, rows);
    return;
  }
  if (transposed && WholeBlockFast(g, o0, o1)) {
    if (g.elem_bytes == 4) {
      BlockK16<4, false>(g, tiles, rows);
    } else {
      BlockK16<2, false>(g, tiles, rows);
    }
    return;
  }
#endif
  if (g.elem_bytes == 2) {
    TilesToRowsScalar<uint16_t>(g, transposed, tiles, o0, o1, rows);
  } else {
    TilesToRowsScalar<uint32_t>(g, transposed, tiles, o0, o1, rows);
  }
}

}  // namespace pdserve::kv_internal
