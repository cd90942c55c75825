#include "common/backend/cpu/bf16_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/backend/cpu/quantized_amx.h"

namespace pdserve {
namespace {

constexpr int kPanel = 64;
constexpr int64_t kPairBytes = kPanel * 4;  // one pair of k in a panel

bool DetectAmxBf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("amx-tile") &&
         __builtin_cpu_supports("amx-bf16") && AmxTileStateGranted();
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,amx-tile,amx-bf16")

// One row tile (up to 16 rows, as configured) against the whole panel in
// one pass, into c[rows][64 columns] (rows ldc floats apart: y itself for a
// whole panel): the four column tiles' sums in tiles 0-3, the activations
// in 4, the weights through 5-7, so that the panel streams once, in
// order, with the pairs two steps ahead prefetched (what a decode step,
// one row, waits for). `tail`: the panel's last K % 16 pairs, zero-padded
// to 16 (nullptr when none). (The _tile_* intrinsics paste their tile
// numbers into the instruction text: literals only.) Measured against
// other shapes (docs/performance.md, "AMX-BF16, opt-in"): two row tiles x
// two column tiles per pass, and blocks of 8 steps through all row tiles
// with the sums kept in y between blocks, were both slower.
void RowTile(const uint32_t* x, int64_t ldx, const char* panel,
             int64_t full_steps, const char* tail, float* c, int64_t ldc) {
  const int64_t stride = ldx * 4;
  constexpr int64_t kStepBytes = kAmxBf16PairStep * kPairBytes;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t steps = full_steps + (tail != nullptr ? 1 : 0);
  for (int64_t s = 0; s < steps; ++s) {
    const char* b = s < full_steps ? panel + s * kStepBytes : tail;
    if (s + 2 < full_steps) {
      const char* ahead = panel + (s + 2) * kStepBytes;
      for (int64_t line = 0; line < kStepBytes; line += 64) {
        _mm_prefetch(ahead + line, _MM_HINT_T0);
      }
    }
    _tile_loadd(4, x + s * kAmxBf16PairStep, stride);
    _tile_loadd(5, b, kPairBytes);
    _tile_loadd(6, b + 64, kPairBytes);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(7, b + 128, kPairBytes);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(5, b + 192, kPairBytes);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  _tile_stored(2, c + 32, ldc * 4);
  _tile_stored(3, c + 48, ldc * 4);
}

// Rows of the sum and activation tiles in this thread's loaded
// configuration (0: none loaded by this kernel).
thread_local int loaded_rows = 0;

// Configures the tiles for `rows` rows of x (1-16): sums and activations
// that many rows, weights 16 pairs. A remainder of fewer than 16 rows (a
// decode step's one row) then computes and reads only its own rows.
void LoadTiles(int rows) {
  if (loaded_rows == rows) return;
  // Every tile register 64 bytes per row: sums (16 f32 columns),
  // activations (16 pairs) or weights (16 columns, as pairs).
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = t < 5 ? rows : 16;
    cfg.colsb[t] = 64;
  }
  LoadAmxTileConfig(cfg);
  loaded_rows = rows;
}

void ReleaseTiles() {
  if (loaded_rows != 0) _tile_release();
  loaded_rows = 0;
}

#pragma GCC pop_options

}  // namespace

bool CpuHasAmxBf16() {
  static const bool has = DetectAmxBf16();
  return has;
}

// Whatever configuration the thread had (another kernel's) is not ours.
AmxBf16TileScope::AmxBf16TileScope() { loaded_rows = 0; }
AmxBf16TileScope::~AmxBf16TileScope() { ReleaseTiles(); }

void Bf16PanelAmx(const uint32_t* x, int64_t M, int64_t ldx, const char* panel,
                  int64_t K, int valid, float* y, int64_t ldy) {
  alignas(64) float c[16 * kPanel];
  alignas(64) char tail_pairs[kAmxBf16PairStep * kPairBytes];
  const int64_t full_steps = K / kAmxBf16PairStep;
  const int64_t rem = K % kAmxBf16PairStep;
  const char* tail = nullptr;
  if (rem != 0) {
    const int64_t at = full_steps * kAmxBf16PairStep * kPairBytes;
    std::memcpy(tail_pairs, panel + at, rem * kPairBytes);
    std::memset(tail_pairs + rem * kPairBytes, 0,
                (kAmxBf16PairStep - rem) * kPairBytes);
    tail = tail_pairs;
  }
  for (int64_t m0 = 0; m0 < M; m0 += 16) {
    const int rows = static_cast<int>(std::min<int64_t>(16, M - m0));
    LoadTiles(rows);
    if (valid == kPanel) {  // straight into y
      RowTile(x + m0 * ldx, ldx, panel, full_steps, tail, y + m0 * ldy, ldy);
      continue;
    }
    RowTile(x + m0 * ldx, ldx, panel, full_steps, tail, c, kPanel);
    for (int r = 0; r < rows; ++r) {
      std::memcpy(y + (m0 + r) * ldy, c + r * kPanel, valid * sizeof(float));
    }
  }
}

}  // namespace pdserve
