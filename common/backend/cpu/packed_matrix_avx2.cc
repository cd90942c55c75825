#include "common/backend/cpu/packed_matrix_avx2.h"

#include <immintrin.h>

#include <algorithm>

namespace pdserve::cpu_internal {
namespace {

constexpr int kPanel = 64;  // PackedMatrix::kPanel
constexpr int kVectors = kPanel / 8;

// Prefetch distance in the panel stream for a single row (decode), as the
// AVX-512 kernel's.
constexpr int64_t kPrefetchBytes = 4096;

// Everything up to the matching pop is compiled for AVX2+FMA and only runs
// when CpuHasAvx2().
#pragma GCC push_options
#pragma GCC target("avx2,fma")

// R rows of x against NC column vectors (8 columns each) of the panel,
// starting at vector c0, over panel rows [k0, k1). Partial sums continue
// from y when `accumulate` (exact: an f32 stored and reloaded).
template <int R, int NC, bool kBf16>
inline void Kernel(const float* x, int64_t ldx, const char* panel, int64_t k0,
                   int64_t k1, int c0, float* y, int64_t ldy, bool accumulate,
                   const __m256i* masks) {
  __m256 acc[R][NC];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < NC; ++c) {
      acc[r][c] = accumulate ? _mm256_maskload_ps(y + r * ldy + 8 * (c0 + c),
                                                  masks[c0 + c])
                             : _mm256_setzero_ps();
    }
  }
  if constexpr (!kBf16) {
    const float* w = reinterpret_cast<const float*>(panel) + 8 * c0;
    for (int64_t k = k0; k < k1; ++k) {
      const float* wk = w + k * kPanel;
      if constexpr (R == 1) {
        const char* ahead = reinterpret_cast<const char*>(wk) + kPrefetchBytes;
        for (int line = 0; line < NC / 2; ++line) {
          _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
        }
      }
      __m256 wv[NC];
      for (int c = 0; c < NC; ++c) wv[c] = _mm256_load_ps(wk + 8 * c);
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);
        for (int c = 0; c < NC; ++c) {
          acc[r][c] = _mm256_fmadd_ps(xb, wv[c], acc[r][c]);
        }
      }
    }
  } else {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(panel) + 8 * c0;
    const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    for (int64_t j = k0; j < k1; ++j) {
      const uint32_t* wj = w + j * kPanel;
      if constexpr (R == 1) {
        const char* ahead = reinterpret_cast<const char*>(wj) + kPrefetchBytes;
        for (int line = 0; line < NC / 2; ++line) {
          _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
        }
      }
      __m256 whi[NC], wlo[NC];
      for (int c = 0; c < NC; ++c) {
        const __m256i wv =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(wj + 8 * c));
        whi[c] = _mm256_castsi256_ps(_mm256_and_si256(wv, hi_mask));
        wlo[c] = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));
      }
      for (int r = 0; r < R; ++r) {
        const __m256 xhi = _mm256_broadcast_ss(x + r * ldx + 2 * j);
        const __m256 xlo = _mm256_broadcast_ss(x + r * ldx + 2 * j + 1);
        for (int c = 0; c < NC; ++c) {
          acc[r][c] = _mm256_fmadd_ps(xhi, whi[c], acc[r][c]);
          acc[r][c] = _mm256_fmadd_ps(xlo, wlo[c], acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < NC; ++c) {
      _mm256_maskstore_ps(y + r * ldy + 8 * (c0 + c), masks[c0 + c], acc[r][c]);
    }
  }
}

// Rows [m, m + rows) (rows <= kRows) against the vectors [c0, c0 + 2).
template <bool kBf16, int kRows>
void Strip(int rows, const float* x, int64_t ldx, const char* panel, int64_t k0,
           int64_t k1, int c0, float* y, int64_t ldy, bool acc,
           const __m256i* masks) {
  switch (rows) {
    case 6:
      if constexpr (kRows >= 6) {
        Kernel<6, 2, kBf16>(x, ldx, panel, k0, k1, c0, y, ldy, acc, masks);
        break;
      }
      [[fallthrough]];
    case 5:
      if constexpr (kRows >= 5) {
        Kernel<5, 2, kBf16>(x, ldx, panel, k0, k1, c0, y, ldy, acc, masks);
        break;
      }
      [[fallthrough]];
    case 4:
      Kernel<4, 2, kBf16>(x, ldx, panel, k0, k1, c0, y, ldy, acc, masks);
      break;
    case 3:
      Kernel<3, 2, kBf16>(x, ldx, panel, k0, k1, c0, y, ldy, acc, masks);
      break;
    case 2:
      Kernel<2, 2, kBf16>(x, ldx, panel, k0, k1, c0, y, ldy, acc, masks);
      break;
    default:
      Kernel<1, 2, kBf16>(x, ldx, panel, k0, k1, c0, y, ldy, acc, masks);
      break;
  }
}

template <bool kBf16>
void Panel(const float* x, int64_t M, int64_t ldx, const char* panel, int64_t K,
           int valid, float* y, int64_t ldy) {
  __m256i masks[kVectors];
  int vectors = 0;  // column vectors holding at least one valid column
  for (int c = 0; c < kVectors; ++c) {
    const int n = std::clamp(valid - 8 * c, 0, 8);
    alignas(32) int lanes[8];
    for (int i = 0; i < 8; ++i) lanes[i] = i < n ? -1 : 0;
    masks[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
    if (n > 0) vectors = c + 1;
  }
  // Rows per strip: 6 x 2 vectors of f32 sums (12 of the 16 ymm
  // registers), 4 x 2 for bf16, whose weights take 4 registers once split.
  constexpr int kRows = kBf16 ? 4 : 6;
  // K blocks keep the panel slice the row strips re-read in L2 (256 rows:
  // 64 KiB); partial sums go through y exactly.
  constexpr int64_t kc = 256;
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    const int64_t k1 = std::min(K, k0 + kc);
    const bool acc = k0 > 0;
    if (M == 1) {
      // Decode: the whole panel row in one pass (8 sums), streamed once.
      Kernel<1, kVectors, kBf16>(x, ldx, panel, k0, k1, 0, y, ldy, acc, masks);
      continue;
    }
    for (int64_t m = 0; m < M; m += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, M - m));
      for (int c0 = 0; c0 < vectors; c0 += 2) {
        Strip<kBf16, kRows>(rows, x + m * ldx, ldx, panel, k0, k1, c0,
                            y + m * ldy, ldy, acc, masks);
      }
    }
  }
}

#pragma GCC pop_options

}  // namespace

void PanelAvx2(bool bf16, const float* x, int64_t M, int64_t ldx,
               const char* panel, int64_t K, int valid, float* y, int64_t ldy) {
  if (bf16) {
    Panel<true>(x, M, ldx, panel, K, valid, y, ldy);
  } else {
    Panel<false>(x, M, ldx, panel, K, valid, y, ldy);
  }
}

}  // namespace pdserve::cpu_internal
