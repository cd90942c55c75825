#include "common/backend/cpu/packed_matrix.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "common/backend/cpu/bf16_amx.h"
#include "common/backend/cpu/packed_matrix_avx2.h"
#include "common/util/logging.h"

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

// Panel rows: one per k (f32) or per pair of k (bf16); 256 bytes each.
int64_t PanelRows(DType dtype, int64_t k) {
  return dtype == DType::kBF16 ? (k + 1) / 2 : k;
}
constexpr int64_t kPanelRowBytes = kPanel * 4;

int64_t RoundUp(int64_t v, int64_t step) {
  return (v + step - 1) / step * step;
}

float BitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

float FlushSubnormal(float v) {
  return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v;
}

// ---------------------------------------------------------------- AVX-512
// Everything up to the matching pop is compiled for AVX-512 and only runs
// when CpuHasAvx512() (vdpbf16ps only when CpuHasAvx512Bf16()); lambdas
// included, hence the pragma.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")

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

enum class Mode { kF32, kBf16Native, kBf16Emulated };

template <int R, Mode kMode>
inline void Kernel(const void* x, int64_t ldx, const char* panel, int64_t k0,
                   int64_t k1, float* y, int64_t ldy, bool accumulate,
                   const __mmask16 masks[4]) {
  if constexpr (kMode == Mode::kF32) {
    KernelF32<R>(static_cast<const float*>(x), ldx, panel, k0, k1, y, ldy,
                 accumulate, masks);
  } else {
    KernelBf16<R, kMode == Mode::kBf16Native>(x, ldx, panel, k0, k1, y, ldy,
                                              accumulate, masks);
  }
}

// x: f32 rows (kF32), bf16 pair rows (kBf16Native) or split pair rows
// (kBf16Emulated), 4-byte entries, ldx of them per row; K in panel rows (k,
// or pairs of k).
template <Mode kMode>
void PanelAvx512(const void* x, int64_t M, int64_t ldx, const char* panel,
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

#pragma GCC pop_options

// ---------------------------------------------------------------- Scalar
// Same per-element arithmetic as the AVX-512 kernels, hence the same results.
void PanelScalar(DType dtype, const void* x, int64_t M, int64_t ldx,
                 const char* panel, int64_t K, int valid, float* y,
                 int64_t ldy) {
  for (int64_t m = 0; m < M; ++m) {
    for (int c = 0; c < valid; ++c) {
      float acc = 0.0f;
      if (dtype == DType::kBF16) {
        const uint32_t* xp = static_cast<const uint32_t*>(x) + m * ldx;
        const uint32_t* wp = reinterpret_cast<const uint32_t*>(panel);
        for (int64_t j = 0; j < K; ++j) {
          acc = Bf16PairDot(acc, xp[j], wp[j * kPanel + c]);
        }
      } else {
        const float* xf = static_cast<const float*>(x) + m * ldx;
        const float* wf = reinterpret_cast<const float*>(panel);
        for (int64_t k = 0; k < K; ++k) {
          acc = std::fma(xf[k], wf[k * kPanel + c], acc);
        }
      }
      y[m * ldy + c] = acc;
    }
  }
}

bool DetectAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("avx512bw") &&
         std::getenv("PDSERVE_DISABLE_AVX512") == nullptr;
}

bool DetectAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         std::getenv("PDSERVE_DISABLE_AVX2") == nullptr;
}

bool DetectAvx512Bf16() {
  __builtin_cpu_init();
  return DetectAvx512() && __builtin_cpu_supports("avx512bf16") &&
         std::getenv("PDSERVE_DISABLE_AVX512_BF16") == nullptr;
}

// Sets MXCSR's DAZ and FTZ (for the emulated bf16 kernel); restores them.
class ScopedDazFtz {
 public:
  explicit ScopedDazFtz(bool enable) : enabled_(enable) {
    if (enabled_) {
      saved_ = _mm_getcsr();
      _mm_setcsr(saved_ | 0x8040u);
    }
  }
  ~ScopedDazFtz() {
    if (enabled_) _mm_setcsr(saved_);
  }
  ScopedDazFtz(const ScopedDazFtz&) = delete;
  ScopedDazFtz& operator=(const ScopedDazFtz&) = delete;

 private:
  bool enabled_;
  unsigned saved_ = 0;
};

// Widens bf16 pairs to f32, high half then low half per pair (the
// emulated kernel's operand).
void SplitBf16Pairs(const uint32_t* pairs, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    out[2 * j] = BitsToFloat(pairs[j] & 0xffff0000u);
    out[2 * j + 1] = BitsToFloat(pairs[j] << 16);
  }
}

// Whether vdpbf16ps is faster here than its emulation (two FMAs per pair
// under DAZ|FTZ, same bits) for `rows` rows of x: times both on one
// L2-resident panel of 768 k, best of 7 alternating tries each. AMD Zen 4/5
// run vdpbf16ps at the FMA rate (two k per instruction); on the Intel Xeon
// of docs/performance.md the emulation was faster for many rows.
bool Vdpbf16psFaster(int64_t rows) {
  constexpr int64_t kPairs = 384;
  std::vector<uint32_t> x(rows * kPairs);
  std::vector<float> split(rows * kPairs * 2);
  AlignedBuffer panel = AllocateAligned(kPairs * kPanel * 4);
  uint32_t* w = reinterpret_cast<uint32_t*>(panel.get());
  uint32_t v = 0x3f803f80u;
  auto next = [&v] { return (v = v * 1664525u + 1013904223u) & 0xbf7fbf7fu; };
  for (auto& e : x) e = next();
  for (int64_t i = 0; i < kPairs * kPanel; ++i) w[i] = next();
  SplitBf16Pairs(x.data(), rows * kPairs, split.data());
  std::vector<float> y(rows * kPanel);
  const int reps = static_cast<int>(std::max<int64_t>(4, 256 / rows));
  auto time = [&](bool native) {
    const ScopedDazFtz daz_ftz(!native);
    const auto start = std::chrono::steady_clock::now();
    for (int rep = 0; rep < reps; ++rep) {
      if (native) {
        PanelAvx512<Mode::kBf16Native>(x.data(), rows, kPairs, panel.get(),
                                       kPairs, kPanel, y.data(), kPanel);
      } else {
        PanelAvx512<Mode::kBf16Emulated>(split.data(), rows, 2 * kPairs,
                                         panel.get(), kPairs, kPanel, y.data(),
                                         kPanel);
      }
    }
    return std::chrono::steady_clock::now() - start;
  };
  auto best_native = std::chrono::steady_clock::duration::max();
  auto best_emulated = best_native;
  for (int i = 0; i < 7; ++i) {
    best_native = std::min(best_native, time(true));
    best_emulated = std::min(best_emulated, time(false));
  }
  return best_native <= best_emulated;
}

bool ChooseVdpbf16ps(int64_t rows) {
  if (!CpuHasAvx512Bf16()) return false;
  const char* choice = std::getenv("PDSERVE_BF16_KERNEL");
  if (choice != nullptr && std::strcmp(choice, "vdpbf16ps") == 0) return true;
  if (choice != nullptr && std::strcmp(choice, "fma") == 0) return false;
  return Vdpbf16psFaster(rows);
}

}  // namespace

bool CpuHasAvx512() {
  static const bool has = DetectAvx512();
  return has;
}

bool CpuHasAvx2() {
  static const bool has = DetectAvx2();
  return has;
}

bool CpuHasAvx512Bf16() {
  static const bool has = DetectAvx512Bf16();
  return has;
}

bool UseAmxBf16() {
  static const bool use = [] {
    const char* choice = std::getenv("PDSERVE_BF16_KERNEL");
    if (choice == nullptr || std::strcmp(choice, "amx") != 0) return false;
    if (!CpuHasAmxBf16()) {
      PDSERVE_LOG_WARNING(
          "PDSERVE_BF16_KERNEL=amx: this CPU has no AMX-BF16 (or "
          "PDSERVE_DISABLE_AMX is set); bf16 runs the default kernel");
      return false;
    }
    return true;
  }();
  return use;
}

bool UseVdpbf16ps(int64_t rows) {
  // Decode-sized products (fewer rows than one micro-kernel call) and
  // prefill-sized ones, each timed once.
  if (rows < kMaxRows) {
    static const bool few = ChooseVdpbf16ps(1);
    return few;
  }
  static const bool many = ChooseVdpbf16ps(48);
  return many;
}

float Bf16PairDot(float acc, uint32_t a, uint32_t b) {
  const float ahi = FlushSubnormal(BitsToFloat(a & 0xffff0000u));
  const float bhi = FlushSubnormal(BitsToFloat(b & 0xffff0000u));
  const float alo = FlushSubnormal(BitsToFloat(a << 16));
  const float blo = FlushSubnormal(BitsToFloat(b << 16));
  acc = FlushSubnormal(std::fma(ahi, bhi, FlushSubnormal(acc)));
  return FlushSubnormal(std::fma(alo, blo, acc));
}

void RoundToBf16Pairs(const float* x, int64_t n, uint32_t* out) {
  if (CpuHasAvx512()) {
    RoundToBf16PairsAvx512(x, n, out);
    return;
  }
  for (int64_t j = 0; j < (n + 1) / 2; ++j) {
    const uint32_t lo = F32ToBf16(x[2 * j]);
    const uint32_t hi = 2 * j + 1 < n ? F32ToBf16(x[2 * j + 1]) : 0u;
    out[j] = lo | (hi << 16);
  }
}

PackedMatrix::PackedMatrix(int64_t n, int64_t k, DType dtype)
    : n_(n), k_(k), dtype_(dtype) {
  num_panels_ = (n_ + kPanel - 1) / kPanel;
  panel_bytes_ = PanelRows(dtype, k_) * kPanelRowBytes;
  bytes_ = num_panels_ * panel_bytes_;
  data_ = AllocateWeights(bytes_);
  std::memset(data_.get(), 0, bytes_);
}

void PackedMatrix::PackRows(int64_t row0, const WeightView& part) {
  std::vector<float> row(k_);
  const char* src = static_cast<const char*>(part.data);
  const int64_t row_bytes = k_ * DTypeSize(part.dtype);
  for (int64_t r = 0; r < part.shape[0]; ++r) {
    const int64_t n = row0 + r;
    ConvertToF32(part.dtype, src + r * row_bytes, k_, row.data());
    SetRow(n, row.data());
  }
}

void PackedMatrix::SetRow(int64_t n, const float* row) {
  char* panel = data_.get() + (n / kPanel) * panel_bytes_;
  const int c = static_cast<int>(n % kPanel);
  if (dtype_ == DType::kBF16) {
    // Pair j of column c: uint16 index 2 * (j * 64 + c) + (k & 1).
    uint16_t* dst = reinterpret_cast<uint16_t*>(panel) + 2 * c;
    for (int64_t k = 0; k < k_; ++k) {
      dst[(k / 2) * 2 * kPanel + (k & 1)] = F32ToBf16(row[k]);
    }
  } else {
    float* dst = reinterpret_cast<float*>(panel) + c;
    for (int64_t k = 0; k < k_; ++k) dst[k * kPanel] = row[k];
  }
}

void PackedMatrix::GetRow(int64_t row, float* out) const {
  const char* p = panel(row / kPanel);
  const int c = static_cast<int>(row % kPanel);
  if (dtype_ == DType::kBF16) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(p) + 2 * c;
    for (int64_t k = 0; k < k_; ++k) {
      out[k] = Bf16ToF32(w[(k / 2) * 2 * kPanel + (k & 1)]);
    }
  } else {
    const float* w = reinterpret_cast<const float*>(p) + c;
    for (int64_t k = 0; k < k_; ++k) out[k] = w[k * kPanel];
  }
}

void MatMul(ThreadPool& pool, const float* x, int64_t M, int64_t ldx,
            const PackedMatrix& w, const float* bias, float* y, int64_t ldy) {
  if (M <= 0) return;
  const bool avx512 = CpuHasAvx512();
  const bool bf16 = w.dtype() == DType::kBF16;
  const bool amx_bf16 = bf16 && UseAmxBf16();
  const bool native_bf16 = bf16 && avx512 && !amx_bf16 && UseVdpbf16ps(M);
  // Without AVX-512 the AVX2 kernel runs where the CPU has it (the same
  // bits), else scalar code.
  const bool avx2 = !avx512 && CpuHasAvx2();
  const bool split_bf16 = bf16 && (avx512 || avx2) && !amx_bf16 && !native_bf16;
  const int64_t K = PanelRows(w.dtype(), w.k());
  // bf16: the activations rounded to bf16 pairs once per call (and, for the
  // emulated kernel, widened back to f32 pair by pair).
  const void* xin = x;
  int64_t ldxin = ldx;
  thread_local std::vector<uint32_t> pairs;
  thread_local std::vector<float> split;
  if (bf16) {
    // AMX reads whole tiles of 16 pairs: zero-filled past K.
    const int64_t ldp = amx_bf16 ? RoundUp(K, kAmxBf16PairStep) : K;
    if (static_cast<int64_t>(pairs.size()) < M * ldp) pairs.resize(M * ldp);
    if (split_bf16 && static_cast<int64_t>(split.size()) < 2 * M * K) {
      split.resize(2 * M * K);
    }
    // Pointers taken here: the buffers are this thread's, and round_rows
    // may run on the pool's threads.
    uint32_t* out = pairs.data();
    float* split_out = split_bf16 ? split.data() : nullptr;
    auto round_rows = [&](int64_t b, int64_t e, int) {
      for (int64_t m = b; m < e; ++m) {
        RoundToBf16Pairs(x + m * ldx, w.k(), out + m * ldp);
        std::fill(out + m * ldp + K, out + (m + 1) * ldp, 0u);
        if (split_out != nullptr) {
          SplitBf16Pairs(out + m * ldp, K, split_out + 2 * m * K);
        }
      }
    };
    if (M >= 16) {
      pool.ParallelFor(M, round_rows);
    } else {
      round_rows(0, M, 0);
    }
    xin = out;
    ldxin = ldp;
    if (split_out != nullptr) {
      xin = split_out;
      ldxin = 2 * K;
    }
  }
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
        const ScopedDazFtz daz_ftz(split_bf16);
        std::optional<AmxBf16TileScope> tiles;
        if (amx_bf16) tiles.emplace();
        for (int64_t chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
             chunk < chunks;
             chunk = next_chunk.fetch_add(1, std::memory_order_relaxed)) {
          for (int64_t p = chunk * per_chunk;
               p < std::min(panels, (chunk + 1) * per_chunk); ++p) {
            const int valid =
                static_cast<int>(std::min<int64_t>(kPanel, w.n() - p * kPanel));
            float* yp = y + p * kPanel;
            const char* panel = w.panel(p);
            if (amx_bf16) {
              Bf16PanelAmx(static_cast<const uint32_t*>(xin), M, ldxin, panel,
                           K, valid, yp, ldy);
            } else if (avx2) {
              cpu_internal::PanelAvx2(bf16, static_cast<const float*>(xin), M,
                                      ldxin, panel, K, valid, yp, ldy);
            } else if (!avx512) {
              PanelScalar(w.dtype(), xin, M, ldxin, panel, K, valid, yp, ldy);
            } else if (native_bf16) {
              PanelAvx512<Mode::kBf16Native>(xin, M, ldxin, panel, K, valid, yp,
                                             ldy);
            } else if (bf16) {
              PanelAvx512<Mode::kBf16Emulated>(xin, M, ldxin, panel, K, valid,
                                               yp, ldy);
            } else {
              PanelAvx512<Mode::kF32>(xin, M, ldxin, panel, K, valid, yp, ldy);
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
