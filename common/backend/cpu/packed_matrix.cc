#include "common/backend/cpu/packed_matrix.h"

#include <immintrin.h>  // MXCSR (ScopedDazFtz)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "common/backend/cpu/bf16_amx.h"
#include "common/backend/cpu/packed_matrix_avx2.h"
#include "common/backend/cpu/packed_matrix_avx512.h"
#include "common/util/logging.h"

namespace pdserve {
namespace {

using cpu_internal::Avx512Mode;
using cpu_internal::PanelAvx512;

constexpr int kPanel = PackedMatrix::kPanel;
// Rows per AVX-512 micro-kernel call: fewer is a decode-sized product.
constexpr int kMaxRows = cpu_internal::kAvx512KernelRows;

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

// ---------------------------------------------------------------- Scalar
// Same per-element arithmetic as the AVX-512 and AVX2 kernels, hence the same
// results.
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
        PanelAvx512(Avx512Mode::kBf16Native, x.data(), rows, kPairs,
                    panel.get(), kPairs, kPanel, y.data(), kPanel);
      } else {
        PanelAvx512(Avx512Mode::kBf16Emulated, split.data(), rows, 2 * kPairs,
                    panel.get(), kPairs, kPanel, y.data(), kPanel);
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
    cpu_internal::RoundToBf16PairsAvx512(x, n, out);
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
              PanelAvx512(Avx512Mode::kBf16Native, xin, M, ldxin, panel, K,
                          valid, yp, ldy);
            } else if (bf16) {
              PanelAvx512(Avx512Mode::kBf16Emulated, xin, M, ldxin, panel, K,
                          valid, yp, ldy);
            } else {
              PanelAvx512(Avx512Mode::kF32, xin, M, ldxin, panel, K, valid, yp,
                          ldy);
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
