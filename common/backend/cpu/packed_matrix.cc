#include "common/backend/cpu/packed_matrix.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace pdserve {
namespace {

constexpr int kPanel = PackedMatrix::kPanel;
constexpr int kMaxRows = 6;  // rows per micro-kernel call (6 x 4 zmm accs)

// A single row streams the panels once from memory at a few FMAs per cache
// line, so its out-of-order window alone keeps too few lines in flight (bf16
// reached ~75% of a plain read); prefetching this far ahead in the panel
// stream (panels are contiguous, so past a panel's end is the next one)
// brings it to ~90-100%. Measured best among 1-16 KiB.
constexpr int64_t kPrefetchBytes = 4096;

int64_t PanelStrideBytes(DType dtype) { return kPanel * DTypeSize(dtype); }

// Position of column c (0..63) of a panel row in the bf16 layout: 32-bit lane
// i of the v-th 512-bit vector holds column v*32+i (low half) and v*32+16+i
// (high half), so one shift and one mask widen it to two f32 vectors.
int Bf16Slot(int c) {
  const int v = c / 32, within = c % 32;
  return v * 32 + 2 * (within % 16) + within / 16;
}

// ---------------------------------------------------------------- AVX-512

template <int R, bool kBf16>
__attribute__((target("avx512f,fma"))) inline void KernelAvx512(
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
  if constexpr (kBf16) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(panel);
    const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    for (int64_t k = k0; k < k1; ++k) {
      if constexpr (R == 1) {
        const char* ahead =
            reinterpret_cast<const char*>(w + k * kPanel) + kPrefetchBytes;
        _mm_prefetch(ahead, _MM_HINT_T0);
        _mm_prefetch(ahead + 64, _MM_HINT_T0);
      }
      const __m512i a = _mm512_load_si512(w + k * kPanel);
      const __m512i b = _mm512_load_si512(w + k * kPanel + 32);
      const __m512 wv[4] = {_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                            _mm512_castsi512_ps(_mm512_and_si512(a, hi_mask)),
                            _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)),
                            _mm512_castsi512_ps(_mm512_and_si512(b, hi_mask))};
      for (int r = 0; r < R; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * ldx + k]);
        for (int c = 0; c < 4; ++c) {
          acc[r][c] = _mm512_fmadd_ps(xb, wv[c], acc[r][c]);
        }
      }
    }
  } else {
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
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) {
      _mm512_mask_storeu_ps(y + r * ldy + 16 * c, masks[c], acc[r][c]);
    }
  }
}

template <bool kBf16>
__attribute__((target("avx512f,fma"))) void PanelAvx512(const float* x,
                                                        int64_t M, int64_t ldx,
                                                        const char* panel,
                                                        int64_t K, int valid,
                                                        float* y, int64_t ldy) {
  __mmask16 masks[4];
  for (int c = 0; c < 4; ++c) {
    const int n = std::clamp(valid - 16 * c, 0, 16);
    masks[c] = static_cast<__mmask16>((1u << n) - 1u);
  }
  // K blocks bound the panel slice that all row groups re-read (2048 rows of
  // the panel: 512 KiB f32, within L2); partial sums go through y unchanged,
  // so each element's FMA chain is the same. Measured single-threaded
  // against oneDNN (512 x 4096 x 768, f32): blocks of 128 rows (a slice in
  // L1) reached 87% of its rate, whole K up to 2048 101%: the accumulator
  // reload/store per block costs more than streaming the slice from L2.
  constexpr int64_t kc = 2048;
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    const int64_t k1 = std::min(K, k0 + kc);
    const bool acc = k0 > 0;
    for (int64_t m = 0; m < M; m += kMaxRows) {
      const float* xm = x + m * ldx;
      float* ym = y + m * ldy;
      switch (std::min<int64_t>(kMaxRows, M - m)) {
        case 6:
          KernelAvx512<6, kBf16>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        case 5:
          KernelAvx512<5, kBf16>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        case 4:
          KernelAvx512<4, kBf16>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        case 3:
          KernelAvx512<3, kBf16>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        case 2:
          KernelAvx512<2, kBf16>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
        default:
          KernelAvx512<1, kBf16>(xm, ldx, panel, k0, k1, ym, ldy, acc, masks);
          break;
      }
    }
  }
}

// ---------------------------------------------------------------- Scalar
// Same per-element arithmetic (one correctly rounded FMA per k, k from 0),
// hence the same results as the AVX-512 kernel.
void PanelScalar(DType dtype, const float* x, int64_t M, int64_t ldx,
                 const char* panel, int64_t K, int valid, float* y,
                 int64_t ldy) {
  for (int64_t m = 0; m < M; ++m) {
    for (int c = 0; c < valid; ++c) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        float w;
        if (dtype == DType::kBF16) {
          const uint16_t* wp = reinterpret_cast<const uint16_t*>(panel);
          w = Bf16ToF32(wp[k * kPanel + Bf16Slot(c)]);
        } else {
          w = reinterpret_cast<const float*>(panel)[k * kPanel + c];
        }
        acc = std::fma(x[m * ldx + k], w, acc);
      }
      y[m * ldy + c] = acc;
    }
  }
}

bool DetectAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") &&
         std::getenv("PDSERVE_DISABLE_AVX512") == nullptr;
}

}  // namespace

void AlignedFree::operator()(void* p) const { std::free(p); }

AlignedBuffer AllocateAligned(int64_t bytes) {
  const int64_t rounded = (std::max<int64_t>(bytes, 64) + 63) / 64 * 64;
  return AlignedBuffer(static_cast<char*>(std::aligned_alloc(64, rounded)));
}

bool CpuHasAvx512() {
  static const bool has = DetectAvx512();
  return has;
}

PackedMatrix::PackedMatrix(int64_t n, int64_t k, DType dtype)
    : n_(n), k_(k), dtype_(dtype) {
  num_panels_ = (n_ + kPanel - 1) / kPanel;
  panel_bytes_ = k_ * PanelStrideBytes(dtype);
  bytes_ = num_panels_ * panel_bytes_;
  data_ = AllocateAligned(bytes_);
  std::memset(data_.get(), 0, bytes_);
}

void PackedMatrix::PackRows(int64_t row0, const WeightView& part) {
  std::vector<float> row(k_);
  const char* src = static_cast<const char*>(part.data);
  const int64_t row_bytes = k_ * DTypeSize(part.dtype);
  for (int64_t r = 0; r < part.shape[0]; ++r) {
    const int64_t n = row0 + r;
    ConvertToF32(part.dtype, src + r * row_bytes, k_, row.data());
    char* panel = data_.get() + (n / kPanel) * panel_bytes_;
    const int c = static_cast<int>(n % kPanel);
    if (dtype_ == DType::kBF16) {
      uint16_t* dst = reinterpret_cast<uint16_t*>(panel) + Bf16Slot(c);
      for (int64_t k = 0; k < k_; ++k) dst[k * kPanel] = F32ToBf16(row[k]);
    } else {
      float* dst = reinterpret_cast<float*>(panel) + c;
      for (int64_t k = 0; k < k_; ++k) dst[k * kPanel] = row[k];
    }
  }
}

void PackedMatrix::GetRow(int64_t row, float* out) const {
  const char* p = panel(row / kPanel);
  const int c = static_cast<int>(row % kPanel);
  if (dtype_ == DType::kBF16) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(p) + Bf16Slot(c);
    for (int64_t k = 0; k < k_; ++k) out[k] = Bf16ToF32(w[k * kPanel]);
  } else {
    const float* w = reinterpret_cast<const float*>(p) + c;
    for (int64_t k = 0; k < k_; ++k) out[k] = w[k * kPanel];
  }
}

void MatMul(ThreadPool& pool, const float* x, int64_t M, int64_t ldx,
            const PackedMatrix& w, const float* bias, float* y, int64_t ldy) {
  if (M <= 0) return;
  const bool avx512 = CpuHasAvx512();
  const int64_t K = w.k();
  // Threads take chunks of consecutive panels from a shared counter, so a
  // thread that is slowed (another process, a busier memory channel) does
  // not hold the others at the barrier. Which thread computes a panel never
  // changes its arithmetic. A chunk is ~kChunkBytes of weights: long enough
  // runs for the prefetchers, enough chunks to balance.
  constexpr int64_t kChunkBytes = 256 << 10;
  const int64_t panels = w.num_panels();
  const int64_t per_chunk = std::clamp<int64_t>(
      kChunkBytes / std::max<int64_t>(1, w.bytes() / panels), 1,
      std::max<int64_t>(1, panels / (4 * pool.num_threads())));
  const int64_t chunks = (panels + per_chunk - 1) / per_chunk;
  std::atomic<int64_t> next_chunk{0};
  pool.ParallelFor(
      std::min<int64_t>(chunks, pool.num_threads()),
      [&](int64_t, int64_t, int) {
        for (int64_t chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
             chunk < chunks;
             chunk = next_chunk.fetch_add(1, std::memory_order_relaxed)) {
          for (int64_t p = chunk * per_chunk;
               p < std::min(panels, (chunk + 1) * per_chunk); ++p) {
            const int valid =
                static_cast<int>(std::min<int64_t>(kPanel, w.n() - p * kPanel));
            float* yp = y + p * kPanel;
            if (avx512) {
              if (w.dtype() == DType::kBF16) {
                PanelAvx512<true>(x, M, ldx, w.panel(p), K, valid, yp, ldy);
              } else {
                PanelAvx512<false>(x, M, ldx, w.panel(p), K, valid, yp, ldy);
              }
            } else {
              PanelScalar(w.dtype(), x, M, ldx, w.panel(p), K, valid, yp, ldy);
            }
            if (bias != nullptr) {
              const float* b = bias + p * kPanel;
              for (int64_t m = 0; m < M; ++m) {
                float* row = yp + m * ldy;
                for (int c = 0; c < valid; ++c) row[c] += b[c];
              }
            }
          }
        }
      });
}

}  // namespace pdserve
