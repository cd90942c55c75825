#include "common/backend/cpu/packed_matrix_avx512.h"

#include <immintrin.h>

#include <algorithm>

namespace pdserve::cpu_internal {
namespace {

constexpr int kPanel = 64;                   // PackedMatrix::kPanel
constexpr int kMaxRows = kAvx512KernelRows;  // 6 x 4 zmm accumulators

// A single row streams the panels once from memory at a few FMAs per cache
// line, so its out-of-order window alone keeps too few lines in flight (bf16
// reached ~75% of a plain read); prefetching this far ahead in the panel
// stream (panels are contiguous, so past a panel's end is the next one)
// brings it to ~90-100%. Measured best among 1-16 KiB.
constexpr int64_t kPrefetchBytes = 4096;

// Everything up to the matching pop is compiled for AVX-512 and only runs
// when CpuHasAvx512() (vdpbf16ps only when CpuHasAvx512Bf16()); lambdas
// included, hence the pragma.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")
// GCC 12 warns about the `__Y = __Y` idiom inside its own intrinsics
// (_mm512_slli_epi32 inlined here): a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// f32 weights: one FMA per k.
template <int R>
__attribute__((target("avx512f,fma"))) inline void KernelF32(
    const float* x, int64_t ldx, const char* panel, int64_t k0, int64_t k1,
    float* y, int64_t ldy, bool accumulate, const __mmask16 masks[4]) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) {
      acc[r][c] = accumulate
                      ? _mm512_maskz_loadu_ps(masks[c], y + r * ldy + 16 * c)
                      : _mm512_setzero_ps();
    }
  }
  const float* w = reinterpret_cast<const float*>(panel);
  for (int64_t k = k0; k < k1; ++k) {
    if constexpr (R == 1) {
      const char* ahead =
          reinterpret_cast<const char*>(w + k * kPanel) + kPrefetchBytes;
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
      _mm_prefetch(ahead + 128, _MM_HINT_T0);
      _mm_prefetch(ahead + 192, _MM_HINT_T0);
    }
    const __m512 wv[4] = {_mm512_load_ps(w + k * kPanel),
                          _mm512_load_ps(w + k * kPanel + 16),
                          _mm512_load_ps(w + k * kPanel + 32),
                          _mm512_load_ps(w + k * kPanel + 48)};
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * ldx + k]);
      for (int c = 0; c < 4; ++c) {
        acc[r][c] = _mm512_fmadd_ps(xb, wv[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) {
      _mm512_mask_storeu_ps(y + r * ldy + 16 * c, masks[c], acc[r][c]);
    }
  }
}

// bf16 weights against x, pair rows [j0, j1). kNative: vdpbf16ps, x as bf16
// pairs (one uint32 per pair of k; ldx in pairs). Else two FMAs per pair
// (high half first), which equals it under DAZ|FTZ (set by the caller), x
// as the pairs' halves widened to f32, high then low (SplitBf16Pairs; ldx in
// floats), so that each is a broadcast from memory, not from a register.
template <int R, bool kNative>
__attribute__((target("avx512f,avx512bf16,fma"))) inline void KernelBf16(
    const void* xv, int64_t ldx, const char* panel, int64_t j0, int64_t j1,
    float* y, int64_t ldy, bool accumulate, const __mmask16 masks[4]) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) {
      acc[r][c] = accumulate
                      ? _mm512_maskz_loadu_ps(masks[c], y + r * ldy + 16 * c)
                      : _mm512_setzero_ps();
    }
  }
  const uint32_t* w = reinterpret_cast<const uint32_t*>(panel);
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t j = j0; j < j1; ++j) {
    if constexpr (R == 1) {
      const char* ahead =
          reinterpret_cast<const char*>(w + j * kPanel) + kPrefetchBytes;
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
      _mm_prefetch(ahead + 128, _MM_HINT_T0);
      _mm_prefetch(ahead + 192, _MM_HINT_T0);
    }
    __m512i wv[4];
    for (int c = 0; c < 4; ++c) {
      wv[c] = _mm512_load_si512(w + j * kPanel + 16 * c);
    }
    if constexpr (kNative) {
      const uint32_t* x = static_cast<const uint32_t*>(xv);
      for (int r = 0; r < R; ++r) {
        const __m512bh xb =
            (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * ldx + j]));
        for (int c = 0; c < 4; ++c) {
          acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xb, (__m512bh)wv[c]);
        }
      }
    } else {
      __m512 whi[4], wlo[4];
      for (int c = 0; c < 4; ++c) {
        whi[c] = _mm512_castsi512_ps(_mm512_and_si512(wv[c], hi_mask));
        wlo[c] = _mm512_castsi512_ps(_mm512_slli_epi32(wv[c], 16));
      }
      const float* x = static_cast<const float*>(xv);
      for (int r = 0; r < R; ++r) {
        const __m512 xhi = _mm512_set1_ps(x[r * ldx + 2 * j]);
        const __m512 xlo = _mm512_set1_ps(x[r * ldx + 2 * j + 1]);
        for (int c = 0; c < 4; ++c) {
          acc[r][c] = _mm512_fmadd_ps(xhi, whi[c], acc[r][c]);
          acc[r][c] = _mm512_fmadd_ps(xlo, wlo[c], acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) {
      _mm512_mask_storeu_ps(y + r * ldy + 16 * c, masks[c], acc[r][c]);
    }
  }
}

template <int R, Avx512Mode kMode>
inline void Kernel(const void* x, int64_t ldx, const char* panel, int64_t k0,
                   int64_t k1, float* y, int64_t ldy, bool accumulate,
                   const __mmask16 masks[4]) {
  if constexpr (kMode == Avx512Mode::kF32) {
    KernelF32<R>(static_cast<const float*>(x), ldx, panel, k0, k1, y, ldy,
                 accumulate, masks);
  } else {
    KernelBf16<R, kMode == Avx512Mode::kBf16Native>(x, ldx, panel, k0, k1, y,
                                                    ldy, accumulate, masks);
  }
}

// x: f32 rows (kF32), bf16 pair rows (kBf16Native) or split pair rows
// (kBf16Emulated), 4-byte entries, ldx of them per row; K in panel rows (k,
// or pairs of k).
template <Avx512Mode kMode>
void PanelTemplate(const void* x, int64_t M, int64_t ldx, const char* panel,
                   int64_t K, int valid, float* y, int64_t ldy) {
  __mmask16 masks[4];
  for (int c = 0; c < 4; ++c) {
    const int n = std::clamp(valid - 16 * c, 0, 16);
    masks[c] = static_cast<__mmask16>((1u << n) - 1u);
  }
  // K blocks bound the panel slice that all row groups re-read (2048 rows of
  // the panel: 512 KiB, within L2); partial sums go through y unchanged, so
  // each element's chain of operations is the same. Measured single-threaded
  // against oneDNN (512 x 4096 x 768, f32): blocks of 128 rows (a slice in
  // L1) reached 87% of its rate, whole K up to 2048 101%: the accumulator
  // reload/store per block costs more than streaming the slice from L2.
  constexpr int64_t kc = 2048;
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    const int64_t k1 = std::min(K, k0 + kc);
    const bool acc = k0 > 0;
    for (int64_t m = 0; m < M; m += kMaxRows) {
      const void* xm = static_cast<const char*>(x) + m * ldx * 4;
      float* ym = y + m * ldy;
      switch (std::min<int64_t>(kMaxRows, M - m)) {
        case 6:
          Kernel<6, kMode>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        case 5:
          Kernel<5, kMode>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        case 4:
          Kernel<4, kMode>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        case 3:
          Kernel<3, kMode>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        case 2:
          Kernel<2, kMode>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        default:
          Kernel<1, kMode>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
      }
    }
  }
}

}  // namespace

void PanelAvx512(Avx512Mode mode, const void* x, int64_t M, int64_t ldx,
                 const char* panel, int64_t K, int valid, float* y,
                 int64_t ldy) {
  switch (mode) {
    case Avx512Mode::kF32:
      PanelTemplate<Avx512Mode::kF32>(x, M, ldx, panel, K, valid, y, ldy);
      break;
    case Avx512Mode::kBf16Native:
      PanelTemplate<Avx512Mode::kBf16Native>(x, M, ldx, panel, K, valid, y,
                                             ldy);
      break;
    case Avx512Mode::kBf16Emulated:
      PanelTemplate<Avx512Mode::kBf16Emulated>(x, M, ldx, panel, K, valid, y,
                                               ldy);
      break;
  }
}

// Rounds to bf16 pairs, 16 pairs per step (same bits as F32ToBf16).
__attribute__((target("avx512f,avx512bw"))) void RoundToBf16PairsAvx512(
    const float* x, int64_t n, uint32_t* out) {
  const int64_t pairs = (n + 1) / 2;
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i bias = _mm512_set1_epi32(0x7fff);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  const __m512i lo_idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14,
                                          12, 10, 8, 6, 4, 2, 0);
  const __m512i hi_idx = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15,
                                          13, 11, 9, 7, 5, 3, 1);
  auto round = [&](__m512i b) {
    const __mmask16 nan =
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, abs_mask), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), one);
    const __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(bias, lsb));
    // NaN: made quiet, not rounded (as F32ToBf16).
    return _mm512_srli_epi32(_mm512_mask_or_epi32(r, nan, b, quiet), 16);
  };
  for (int64_t j = 0; j < pairs; j += 16) {
    const int64_t e0 = 2 * j;
    const int64_t left = std::min<int64_t>(32, n - e0);
    const __mmask16 m0 =
        static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1u);
    const __mmask16 m1 = static_cast<__mmask16>(
        left >= 32 ? 0xffffu : (left > 16 ? (1u << (left - 16)) - 1u : 0u));
    const __m512i a = round(_mm512_maskz_loadu_epi32(m0, x + e0));
    const __m512i b = round(_mm512_maskz_loadu_epi32(m1, x + e0 + 16));
    // a holds elements e0..e0+15, b e0+16..e0+31; pair i = (2i, 2i+1).
    const __m512i lo = _mm512_permutex2var_epi32(a, lo_idx, b);
    const __m512i hi = _mm512_permutex2var_epi32(a, hi_idx, b);
    const __m512i packed = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
    const int64_t np = std::min<int64_t>(16, pairs - j);
    _mm512_mask_storeu_epi32(out + j, static_cast<__mmask16>((1u << np) - 1u),
                             packed);
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace pdserve::cpu_internal
