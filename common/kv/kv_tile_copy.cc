#include "common/kv/kv_tile_copy.h"

#include <cstdint>
#include <cstdlib>
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

#define PDSERVE_TILE_AVX2 __attribute__((target("avx2")))

// r[i][j] <- r[j][i] for 8 x 8 32-bit lanes.
PDSERVE_TILE_AVX2 inline void Transpose8x8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
    r[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
  }
}

// 8 elements (f32 or bf16 widened to 32-bit lanes) and back.
template <int kBytes>
PDSERVE_TILE_AVX2 inline __m256i Load8(const char* p) {
  if constexpr (kBytes == 4) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
    return _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}
// kStream: a non-temporal store (p aligned to the store's width).
template <int kBytes, bool kStream>
PDSERVE_TILE_AVX2 inline void Store8(char* p, __m256i v) {
  if constexpr (kBytes == 4) {
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    }
  } else {
    // Lanes hold 0..0xffff: packing saturates nothing; the 64-bit units
    // (w0-3, w0-3, w4-7, w4-7) -> w0-7.
    const __m128i h = _mm256_castsi256_si128(
        _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08));
    if constexpr (kStream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(p), h);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
    }
  }
}

// BlockK16 on AVX2: 8 dimensions x 8 tokens at a time.
template <int kBytes, bool kToTiles, bool kStream = false>
PDSERVE_TILE_AVX2 void BlockK16Avx2(const TileGeometry& g, const char* in,
                                    char* out) {
  const int64_t row_bytes = g.row_bytes();
  auto row_at = [&](int h, int token, int d0) {
    return (int64_t{h} * g.head_dim + d0) * kBytes + token * row_bytes;
  };
  auto tile_at = [&](int h, int d, int t0) {
    return h * g.head_stride + (int64_t{d} * 16 + t0) * kBytes;
  };
  for (int h = 0; h < g.kv_heads; ++h) {
    for (int d0 = 0; d0 < g.head_dim; d0 += 8) {
      for (int t0 = 0; t0 < 16; t0 += 8) {
        __m256i r[8];
        for (int i = 0; i < 8; ++i) {
          r[i] = Load8<kBytes>(
              in + (kToTiles ? row_at(h, t0 + i, d0) : tile_at(h, d0 + i, t0)));
        }
        Transpose8x8(r);
        for (int i = 0; i < 8; ++i) {
          Store8<kBytes, kStream>(
              out + (kToTiles ? tile_at(h, d0 + i, t0) : row_at(h, t0 + i, d0)),
              r[i]);
        }
      }
    }
  }
}

// BlockV16 on AVX2 (two 32-byte halves per cache line).
template <bool kToTiles, bool kStream>
PDSERVE_TILE_AVX2 void BlockV16Avx2(const TileGeometry& g, const char* in,
                                    char* out) {
  const int64_t row_bytes = g.row_bytes();
  const int64_t slice = int64_t{g.head_dim} * g.elem_bytes;  // % 64 == 0
  for (int h = 0; h < g.kv_heads; ++h) {
    for (int i = 0; i < 16; ++i) {
      const int64_t row_at = i * row_bytes + h * slice;
      const int64_t tile_at = h * g.head_stride + i * slice;
      const char* from = in + (kToTiles ? row_at : tile_at);
      char* to = out + (kToTiles ? tile_at : row_at);
      for (int64_t at = 0; at < slice; at += 32) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + at));
        if constexpr (kStream) {
          _mm256_stream_si256(reinterpret_cast<__m256i*>(to + at), v);
        } else {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + at), v);
        }
      }
    }
  }
}

// Whether one head's slice of a row is whole cache lines (BlockV16).
bool WholeLineSlices(const TileGeometry& g) {
  return (int64_t{g.head_dim} * g.elem_bytes) % 64 == 0;
}

// PDSERVE_DISABLE_AVX512 / PDSERVE_DISABLE_AVX2 (as for the compute
// kernels) leave the narrower paths to tests.
bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          std::getenv("PDSERVE_DISABLE_AVX512") == nullptr;
  return has;
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") &&
                          std::getenv("PDSERVE_DISABLE_AVX2") == nullptr;
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
  return TileCopyVectorized(g) && o0 == 0 && o1 == 16;
}

}  // namespace

bool TileCopyVectorized(const TileGeometry& g) {
#if defined(__x86_64__)
  return g.block_size == 16 && g.head_dim % 16 == 0 &&
         (g.elem_bytes == 2 || g.elem_bytes == 4) && (HasAvx512() || HasAvx2());
#else
  (void)g;
  return false;
#endif
}

// The widest of each block copy this CPU runs (WholeBlockFast holds).
template <int kBytes, bool kToTiles, bool kStream = false>
void BlockK(const TileGeometry& g, const char* in, char* out) {
  if (HasAvx512()) {
    BlockK16<kBytes, kToTiles, kStream>(g, in, out);
  } else {
    BlockK16Avx2<kBytes, kToTiles, kStream>(g, in, out);
  }
}
template <bool kToTiles, bool kStream>
void BlockV(const TileGeometry& g, const char* in, char* out) {
  if (HasAvx512()) {
    BlockV16<kToTiles, kStream>(g, in, out);
  } else {
    BlockV16Avx2<kToTiles, kStream>(g, in, out);
  }
}

void RowsToTiles(const TileGeometry& g, bool transposed, int o0, int o1,
                 const char* rows, char* tiles, Stores stores) {
#if defined(__x86_64__)
  if (stores == Stores::kStreaming && WholeBlockFast(g, o0, o1) &&
      WholeBlockStreams(g, transposed, tiles)) {
    if (!transposed) {
      BlockV<true, true>(g, rows, tiles);
    } else if (g.elem_bytes == 4) {
      BlockK<4, true, true>(g, rows, tiles);
    } else {
      BlockK<2, true, true>(g, rows, tiles);
    }
    return;
  }
  if (!transposed && WholeBlockFast(g, o0, o1) && WholeLineSlices(g)) {
    BlockV<true, false>(g, rows, tiles);
    return;
  }
  if (transposed && WholeBlockFast(g, o0, o1)) {
    if (g.elem_bytes == 4) {
      BlockK<4, true>(g, rows, tiles);
    } else {
      BlockK<2, true>(g, rows, tiles);
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
    BlockV<false, false>(g, tiles, rows);
    return;
  }
  if (transposed && WholeBlockFast(g, o0, o1)) {
    if (g.elem_bytes == 4) {
      BlockK<4, false>(g, tiles, rows);
    } else {
      BlockK<2, false>(g, tiles, rows);
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
