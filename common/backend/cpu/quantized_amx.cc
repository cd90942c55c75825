#include "common/backend/cpu/quantized_amx.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/backend/cpu/aligned_buffer.h"
#include "common/backend/cpu/quantized_matrix.h"

// GCC 12 reports its own intrinsics' `__m512 __Y = __Y;` idiom (masked
// loads, conversions, reductions) as (maybe-)uninitialized once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve {
namespace {

constexpr int kPanel = QuantizedMatrix::kPanel;
constexpr int kBlock = QuantizedMatrix::kBlock;

bool RequestTileState() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("amx-tile") ||
      std::getenv("PDSERVE_DISABLE_AMX") != nullptr) {
    return false;
  }
  // Linux hands out the 8 KiB tile state only on request (once per process).
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

bool DetectAmx() {
  return CpuHasAvx512Vnni() && __builtin_cpu_supports("amx-int8") &&
         AmxTileStateGranted();
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,f16c,fma,amx-tile,amx-int8")

// One block of weight codes (8 quads of k x 64 columns) as the tiles read
// them: int8, 256 bytes per quad. kSigned: the code minus the symmetric
// zero point (2^(bits-1)), which folds the zero-point correction into the
// integer sum (the same integer). Else the unsigned codes.
template <int kBits, bool kSigned>
inline const char* TileCodes(const char* src, uint8_t* dst) {
  const __m512i nib = _mm512_set1_epi8(0x0f);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i eight = _mm512_set1_epi8(8);
  for (int q = 0; q < 8; ++q) {
    uint8_t* d = dst + q * 256;
    if constexpr (kBits == 8) {
      for (int c = 0; c < 4; ++c) {
        _mm512_store_si512(
            d + 64 * c,
            _mm512_xor_si512(_mm512_load_si512(src + q * 256 + 64 * c), flip));
      }
    } else {
      const __m512i lo = _mm512_load_si512(src + q * 128);
      const __m512i hi = _mm512_load_si512(src + q * 128 + 64);
      __m512i v[4] = {_mm512_and_si512(lo, nib),
                      _mm512_and_si512(_mm512_srli_epi16(lo, 4), nib),
                      _mm512_and_si512(hi, nib),
                      _mm512_and_si512(_mm512_srli_epi16(hi, 4), nib)};
      for (int c = 0; c < 4; ++c) {
        if constexpr (kSigned) v[c] = _mm512_sub_epi8(v[c], eight);
        _mm512_store_si512(d + 64 * c, v[c]);
      }
    }
  }
  return reinterpret_cast<const char*>(dst);
}

// Integer sums of one block for the row group's one or two row tiles and
// the four column tiles, into sums[32 rows][64 columns]. kSigned: signed
// weight codes (tdpbssd), else unsigned (tdpbsud).
// (The _tile_* intrinsics are macros that paste their tile numbers into the
// instruction text, so the tile numbers must be literals: no helper
// templated on them.)
template <bool kTwo, bool kSigned>
inline void BlockSums(const int8_t* xq, int64_t ldq, const char* codes,
                      int32_t* sums) {
  _tile_loadd(4, xq, ldq);
  if constexpr (kTwo) _tile_loadd(5, xq + 16 * ldq, ldq);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    _tile_loadd(6, codes + 128 * h, 256);
    _tile_loadd(7, codes + 128 * h + 64, 256);
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (kSigned) {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
    } else {
      _tile_dpbsud(0, 4, 6);
      _tile_dpbsud(1, 4, 7);
    }
    _tile_stored(0, sums + 32 * h, 256);
    _tile_stored(1, sums + 32 * h + 16, 256);
    if constexpr (kTwo) {
      _tile_zero(2);
      _tile_zero(3);
      if constexpr (kSigned) {
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      } else {
        _tile_dpbsud(2, 5, 6);
        _tile_dpbsud(3, 5, 7);
      }
      _tile_stored(2, sums + 16 * kPanel + 32 * h, 256);
      _tile_stored(3, sums + 16 * kPanel + 32 * h + 16, 256);
    }
  }
}

// Blocks whose integer sums are kept before the float steps run, so that
// each row's accumulators stay in registers across them (8 KiB of sums
// per block).
constexpr int kBatch = 2;

template <int kBits, bool kAsym>
void PanelAmx(const QuantPanelArgs& a, int64_t M) {
  constexpr bool kSigned = !kAsym;  // symmetric: zero point folded in
  constexpr int kBlockCodeBytes = kBits == 8 ? 2048 : 1024;
  alignas(64) int32_t sums[kBatch][kAmxRowGroup * kPanel];
  alignas(64) float scales[kBatch][kPanel];
  alignas(64) int32_t zeros[kBatch][kPanel];
  alignas(64) float acc[kAmxRowGroup * kPanel];
  // The codes as the tiles read them: one block at a time for a single row
  // group; else the whole panel's, converted by the first row group for the
  // others (2 KiB per block of 32 k).
  constexpr bool kConvert = kBits == 4 || kSigned;
  alignas(64) uint8_t block_codes[2048];
  thread_local AlignedBuffer converted;
  thread_local int64_t converted_bytes = 0;
  const int64_t blocks = a.groups * a.blocks_per_group;
  const bool cache = M > kAmxRowGroup;
  if (kConvert && cache && converted_bytes < blocks * 2048) {
    converted = AllocateAligned(blocks * 2048);
    converted_bytes = blocks * 2048;
  }
  for (int64_t m0 = 0; m0 < M; m0 += kAmxRowGroup) {
    const int rows = static_cast<int>(std::min<int64_t>(kAmxRowGroup, M - m0));
    const int8_t* xq = a.xq + m0 * a.ldq;
    const float* xs = a.xs + m0 * a.ldb;
    [[maybe_unused]] const int32_t* xsum = a.xsum + m0 * a.ldb;
    for (int64_t blk0 = 0; blk0 < blocks; blk0 += kBatch) {
      const int nb = static_cast<int>(std::min<int64_t>(kBatch, blocks - blk0));
      for (int j = 0; j < nb; ++j) {
        const int64_t blk = blk0 + j;
        const int64_t g = blk / a.blocks_per_group;
        const char* gp = a.panel + g * a.group_bytes;
        const uint16_t* sp =
            reinterpret_cast<const uint16_t*>(gp + a.code_bytes);
        for (int c = 0; c < 4; ++c) {
          _mm512_store_ps(scales[j] + 16 * c,
                          _mm512_cvtph_ps(_mm256_load_si256(
                              reinterpret_cast<const __m256i*>(sp + 16 * c))));
          if constexpr (kAsym) {
            const uint8_t* zp =
                reinterpret_cast<const uint8_t*>(gp + a.code_bytes) +
                kPanel * 2;
            _mm512_store_si512(
                zeros[j] + 16 * c,
                _mm512_cvtepu8_epi32(_mm_load_si128(
                    reinterpret_cast<const __m128i*>(zp + 16 * c))));
          }
        }
        const char* codes = gp + (blk % a.blocks_per_group) * kBlockCodeBytes;
        if constexpr (kConvert) {
          uint8_t* dst =
              cache ? reinterpret_cast<uint8_t*>(converted.get()) + blk * 2048
                    : block_codes;
          codes = m0 == 0 ? TileCodes<kBits, kSigned>(codes, dst)
                          : reinterpret_cast<const char*>(dst);
        }
        if (rows > 16) {
          BlockSums<true, kSigned>(xq + blk * kBlock, a.ldq, codes, sums[j]);
        } else {
          BlockSums<false, kSigned>(xq + blk * kBlock, a.ldq, codes, sums[j]);
        }
      }
      // The VNNI kernel's float steps, block by block in increasing k.
      for (int r = 0; r < rows; ++r) {
        float* ar = acc + r * kPanel;
        __m512 racc[4];
        for (int c = 0; c < 4; ++c) {
          racc[c] =
              blk0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(ar + 16 * c);
        }
        for (int j = 0; j < nb; ++j) {
          const __m512 sx = _mm512_set1_ps(xs[r * a.ldb + blk0 + j]);
          const int32_t* sr = sums[j] + r * kPanel;
          __m512i qsum = _mm512_setzero_si512();
          if constexpr (kAsym) {
            qsum = _mm512_set1_epi32(xsum[r * a.ldb + blk0 + j]);
          }
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) {
            __m512i isum = _mm512_load_si512(sr + 16 * c);
            if constexpr (kAsym) {
              isum = _mm512_sub_epi32(
                  isum, _mm512_mullo_epi32(_mm512_load_si512(zeros[j] + 16 * c),
                                           qsum));
            }
            racc[c] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(isum),
                _mm512_mul_ps(_mm512_load_ps(scales[j] + 16 * c), sx), racc[c]);
          }
        }
        for (int c = 0; c < 4; ++c) _mm512_store_ps(ar + 16 * c, racc[c]);
      }
    }
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < 4; ++c) {
        _mm512_mask_storeu_ps(a.y + (m0 + r) * a.ldy + 16 * c, a.masks[c],
                              _mm512_load_ps(acc + r * kPanel + 16 * c));
      }
    }
  }
}

void LoadTiles() {
  // Tile registers: 0-3 integer sums (16 rows x 16 columns each: row tile
  // i, column tile j of the current half panel at 2 * i + j), 4-5
  // activation codes (16 rows x 32 k), 6-7 weight codes (8 quads of k x 16
  // columns).
  AmxTileConfig cfg;
  for (int t = 0; t < 4; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = kBlock;
  }
  for (int t = 6; t < 8; ++t) {
    cfg.rows[t] = kBlock / 4;
    cfg.colsb[t] = 64;
  }
  LoadAmxTileConfig(cfg);
}

void ReleaseTiles() { _tile_release(); }

#pragma GCC pop_options

}  // namespace

void LoadAmxTileConfig(const AmxTileConfig& config) {
  // Not _tile_loadconfig: GCC 12's version tells the compiler it reads 8
  // bytes, so the stores of the rest may be dropped.
  asm volatile("ldtilecfg %0" : : "m"(config));
}

bool AmxTileStateGranted() {
  static const bool granted = RequestTileState();
  return granted;
}

bool CpuHasAmxInt8() {
  static const bool has = DetectAmx();
  return has;
}

AmxTileScope::AmxTileScope() { LoadTiles(); }
AmxTileScope::~AmxTileScope() { ReleaseTiles(); }

void QuantPanelAmx(const QuantPanelArgs& a, int64_t M, int bits, bool asym) {
  if (bits == 8) {
    asym ? PanelAmx<8, true>(a, M) : PanelAmx<8, false>(a, M);
  } else {
    asym ? PanelAmx<4, true>(a, M) : PanelAmx<4, false>(a, M);
  }
}

}  // namespace pdserve
