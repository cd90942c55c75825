#include "common/backend/cpu/quantized_matrix.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/quantized_amx.h"
#include "common/backend/cpu/quantized_avx2.h"

// GCC 12 reports its own intrinsics' `__m512 __Y = __Y;` idiom (masked
// loads, conversions, reductions) as (maybe-)uninitialized once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve {
namespace {

constexpr int kPanel = QuantizedMatrix::kPanel;
constexpr int kBlock = QuantizedMatrix::kBlock;
constexpr int kMaxRows = 3;  // rows per micro-kernel call
constexpr int64_t kPrefetchBytes = 4096;

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Byte offset of the code of column c (0..63), k kk (within its group), and
// its nibble (int4), inside a group's codes.
int64_t CodeOffset(int bits, int c, int64_t kk, int* nibble) {
  const int64_t quad = kk / 4;
  const int b = static_cast<int>(kk % 4), cv = c / 16, lane = c % 16;
  if (bits == 8) {
    *nibble = 0;
    return quad * 256 + cv * 64 + lane * 4 + b;
  }
  *nibble = cv % 2;
  return quad * 128 + (cv / 2) * 64 + lane * 4 + b;
}

// The activations of M rows quantized in blocks of 32 (see the header).
struct QuantizedRows {
  int64_t ldq = 0;  // bytes per row of q (padded K)
  int64_t ldb = 0;  // blocks per row
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
};

void QuantizeRowScalar(const float* x, int64_t k, int64_t blocks, int8_t* q,
                       float* scale, int32_t* sum) {
  for (int64_t b = 0; b < blocks; ++b) {
    float amax = 0.0f;
    for (int64_t i = b * kBlock; i < std::min(k, (b + 1) * kBlock); ++i) {
      amax = std::max(amax, std::fabs(x[i]));
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[b] = amax / 127.0f;
    int32_t s = 0;
    for (int64_t i = b * kBlock; i < (b + 1) * kBlock; ++i) {
      const float v = i < k ? x[i] * inv : 0.0f;
      const int32_t r =
          static_cast<int32_t>(std::clamp(std::nearbyint(v), -127.0f, 127.0f));
      q[i] = static_cast<int8_t>(r);
      s += r;
    }
    sum[b] = s;
  }
}

// ---------------------------------------------------------------- AVX-512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")

void QuantizeRowAvx512(const float* x, int64_t k, int64_t blocks, int8_t* q,
                       float* scale, int32_t* sum) {
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock;
    const int64_t left = std::clamp<int64_t>(k - i0, 0, 32);
    const __mmask16 m0 =
        static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1u);
    const __mmask16 m1 = static_cast<__mmask16>(
        left >= 32 ? 0xffffu : (left > 16 ? (1u << (left - 16)) - 1u : 0u));
    const __m512 a = _mm512_maskz_loadu_ps(m0, x + i0);
    const __m512 c = _mm512_maskz_loadu_ps(m1, x + i0 + 16);
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[b] = amax / 127.0f;
    const __m512 iv = _mm512_set1_ps(inv);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    // x * inv rounded half-even (MXCSR default), as std::nearbyint.
    const __m512i qa = _mm512_cvtps_epi32(
        _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(a, iv), lo), hi));
    const __m512i qc = _mm512_cvtps_epi32(
        _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(c, iv), lo), hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i0),
                     _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i0 + 16),
                     _mm512_cvtsepi32_epi8(qc));
    sum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
  }
}

template <int R, int kBits, bool kAsym>
inline void KernelVnni(const QuantPanelArgs& a) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  constexpr int kBlockCodeBytes = kBits == 8 ? 2048 : 1024;  // 8 quads
  constexpr int kQuadBytes = kBits == 8 ? 256 : 128;
  constexpr int32_t kZero = 1 << (kBits - 1);
  const __m512i nib = _mm512_set1_epi8(0x0f);
  for (int64_t g = 0; g < a.groups; ++g) {
    const char* gp = a.panel + g * a.group_bytes;
    const uint16_t* sp = reinterpret_cast<const uint16_t*>(gp + a.code_bytes);
    const uint8_t* zp =
        reinterpret_cast<const uint8_t*>(gp + a.code_bytes) + kPanel * 2;
    for (int64_t b = 0; b < a.blocks_per_group; ++b) {
      const int64_t blk = g * a.blocks_per_group + b;
      const char* cp = gp + b * kBlockCodeBytes;
      __m512i isum[R][4];
      for (int r = 0; r < R; ++r) {
        for (int c = 0; c < 4; ++c) isum[r][c] = _mm512_setzero_si512();
      }
      for (int q = 0; q < 8; ++q) {
        const char* qp = cp + q * kQuadBytes;
        if constexpr (R == 1) {
          _mm_prefetch(qp + kPrefetchBytes, _MM_HINT_T0);
          _mm_prefetch(qp + kPrefetchBytes + 64, _MM_HINT_T0);
          if constexpr (kBits == 8) {
            _mm_prefetch(qp + kPrefetchBytes + 128, _MM_HINT_T0);
            _mm_prefetch(qp + kPrefetchBytes + 192, _MM_HINT_T0);
          }
        }
        __m512i wq[4];
        if constexpr (kBits == 8) {
          for (int c = 0; c < 4; ++c) wq[c] = _mm512_load_si512(qp + 64 * c);
        } else {
          const __m512i lo = _mm512_load_si512(qp);
          const __m512i hi = _mm512_load_si512(qp + 64);
          wq[0] = _mm512_and_si512(lo, nib);
          wq[1] = _mm512_and_si512(_mm512_srli_epi16(lo, 4), nib);
          wq[2] = _mm512_and_si512(hi, nib);
          wq[3] = _mm512_and_si512(_mm512_srli_epi16(hi, 4), nib);
        }
        for (int r = 0; r < R; ++r) {
          int32_t xw;
          std::memcpy(&xw, a.xq + r * a.ldq + blk * kBlock + q * 4, 4);
          const __m512i xb = _mm512_set1_epi32(xw);
          for (int c = 0; c < 4; ++c) {
            isum[r][c] = _mm512_dpbusd_epi32(isum[r][c], wq[c], xb);
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512 sx = _mm512_set1_ps(a.xs[r * a.ldb + blk]);
        const int32_t xsum = a.xsum[r * a.ldb + blk];
        for (int c = 0; c < 4; ++c) {
          __m512i corr;
          if constexpr (kAsym) {
            const __m512i z = _mm512_cvtepu8_epi32(
                _mm_load_si128(reinterpret_cast<const __m128i*>(zp + 16 * c)));
            corr = _mm512_mullo_epi32(z, _mm512_set1_epi32(xsum));
          } else {
            corr = _mm512_set1_epi32(kZero * xsum);
          }
          const __m512 v =
              _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[r][c], corr));
          const __m512 sw = _mm512_cvtph_ps(
              _mm256_load_si256(reinterpret_cast<const __m256i*>(sp + 16 * c)));
          acc[r][c] = _mm512_fmadd_ps(v, _mm512_mul_ps(sw, sx), acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) {
      _mm512_mask_storeu_ps(a.y + r * a.ldy + 16 * c, a.masks[c], acc[r][c]);
    }
  }
}

template <int kBits, bool kAsym>
void PanelVnni(QuantPanelArgs a, int64_t M) {
  const int8_t* xq = a.xq;
  const float* xs = a.xs;
  const int32_t* xsum = a.xsum;
  float* y = a.y;
  for (int64_t m = 0; m < M; m += kMaxRows) {
    a.xq = xq + m * a.ldq;
    a.xs = xs + m * a.ldb;
    a.xsum = xsum + m * a.ldb;
    a.y = y + m * a.ldy;
    switch (std::min<int64_t>(kMaxRows, M - m)) {
      case 3:
        KernelVnni<3, kBits, kAsym>(a);
        break;
      case 2:
        KernelVnni<2, kBits, kAsym>(a);
        break;
      default:
        KernelVnni<1, kBits, kAsym>(a);
        break;
    }
  }
}

#pragma GCC pop_options

// ---------------------------------------------------------------- Scalar
// Same arithmetic as KernelVnni.
void PanelScalar(const QuantizedMatrix& w, const QuantPanelArgs& a, int64_t M,
                 int valid) {
  const int bits = w.format().bits;
  for (int64_t m = 0; m < M; ++m) {
    for (int c = 0; c < valid; ++c) {
      float acc = 0.0f;
      for (int64_t g = 0; g < a.groups; ++g) {
        const char* gp = a.panel + g * a.group_bytes;
        uint16_t sbits;
        std::memcpy(&sbits, gp + a.code_bytes + 2 * c, 2);
        const float sw = F16ToF32(sbits);
        const int32_t zero =
            w.format().symmetric
                ? (1 << (bits - 1))
                : static_cast<uint8_t>(gp[a.code_bytes + 2 * kPanel + c]);
        for (int64_t b = 0; b < a.blocks_per_group; ++b) {
          const int64_t blk = g * a.blocks_per_group + b;
          int32_t isum = 0;
          for (int i = 0; i < kBlock; ++i) {
            int nibble;
            const int64_t off = CodeOffset(bits, c, b * kBlock + i, &nibble);
            const uint8_t byte = static_cast<uint8_t>(gp[off]);
            const int32_t u = bits == 8 ? byte : (byte >> (4 * nibble)) & 15;
            isum += u * a.xq[m * a.ldq + blk * kBlock + i];
          }
          const float v =
              static_cast<float>(isum - zero * a.xsum[m * a.ldb + blk]);
          acc = std::fma(v, sw * a.xs[m * a.ldb + blk], acc);
        }
      }
      a.y[m * a.ldy + c] = acc;
    }
  }
}

// Products of at least this many rows take the AMX kernel when it runs
// (same bits either way). On the Xeon of docs/performance.md VNNI was
// faster up to 8 rows, even at 12, and AMX from 16 (build/tools/matmul_bench).
constexpr int64_t kAmxMinRows = 16;

std::atomic<QuantKernel> forced_kernel{QuantKernel::kAuto};

QuantKernel KernelFromEnv() {
  const char* env = std::getenv("PDSERVE_QUANT_KERNEL");
  if (env == nullptr) return QuantKernel::kAuto;
  const std::string name = env;
  if (name == "amx" && CpuHasAmxInt8()) return QuantKernel::kAmx;
  if (name == "vnni" && CpuHasAvx512Vnni()) return QuantKernel::kVnni;
  if (name == "avx2" && CpuHasAvx2()) return QuantKernel::kAvx2;
  if (name == "scalar") return QuantKernel::kScalar;
  if (!name.empty() && name != "auto") {
    std::fprintf(stderr,
                 "pdserve: PDSERVE_QUANT_KERNEL=%s ignored (amx, vnni, avx2 "
                 "or scalar, and this CPU must run it); choosing by CPU\n",
                 name.c_str());
  }
  return QuantKernel::kAuto;
}

QuantKernel ChooseKernel(int64_t M) {
  static const QuantKernel from_env = KernelFromEnv();
  QuantKernel k = forced_kernel.load(std::memory_order_relaxed);
  if (k == QuantKernel::kAuto) k = from_env;
  if (k != QuantKernel::kAuto) return k;
  if (M >= kAmxMinRows && CpuHasAmxInt8()) return QuantKernel::kAmx;
  if (CpuHasAvx512Vnni()) return QuantKernel::kVnni;
  return CpuHasAvx2() ? QuantKernel::kAvx2 : QuantKernel::kScalar;
}

bool DetectVnni() {
  __builtin_cpu_init();
  return CpuHasAvx512() && __builtin_cpu_supports("avx512vnni") &&
         std::getenv("PDSERVE_DISABLE_AVX512_VNNI") == nullptr;
}

uint16_t ToF16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

}  // namespace

bool CpuHasAvx512Vnni() {
  static const bool has = DetectVnni();
  return has;
}

bool ForceQuantKernel(QuantKernel kernel) {
  if ((kernel == QuantKernel::kAmx && !CpuHasAmxInt8()) ||
      (kernel == QuantKernel::kVnni && !CpuHasAvx512Vnni()) ||
      (kernel == QuantKernel::kAvx2 && !CpuHasAvx2())) {
    return false;
  }
  forced_kernel.store(kernel, std::memory_order_relaxed);
  return true;
}

QuantizedMatrix::QuantizedMatrix(int64_t n, int64_t k,
                                 const QuantFormat& format)
    : n_(n), k_(k), format_(format) {
  if (format_.group_size <= 0) format_.group_size = RoundUp(k_, kBlock);
  groups_ = (k_ + format_.group_size - 1) / format_.group_size;
  num_panels_ = (n_ + kPanel - 1) / kPanel;
  code_bytes_ = int64_t{kPanel} * format_.group_size * format_.bits / 8;
  group_bytes_ = code_bytes_ + kPanel * 2 + (format_.symmetric ? 0 : kPanel);
  panel_bytes_ = groups_ * group_bytes_;
  bytes_ = num_panels_ * panel_bytes_;
  data_ = AllocateWeights(bytes_);
  std::memset(data_.get(), 0, bytes_);
  // Zero weights everywhere until set: codes equal to the zero point.
  if (format_.symmetric) {
    const int zero = 1 << (format_.bits - 1);
    for (int64_t p = 0; p < num_panels_; ++p) {
      for (int64_t g = 0; g < groups_; ++g) {
        char* gp = data_.get() + p * panel_bytes_ + g * group_bytes_;
        std::memset(gp, format_.bits == 8 ? zero : zero | (zero << 4),
                    code_bytes_);
      }
    }
  }
}

void QuantizedMatrix::SetCodes(int64_t n, const uint8_t* codes,
                               const float* scales, const uint8_t* zeros) {
  const int c = static_cast<int>(n % kPanel);
  const int64_t G = format_.group_size;
  for (int64_t g = 0; g < groups_; ++g) {
    char* gp = GroupAt(n, g);
    const uint16_t s = ToF16(scales[g]);
    std::memcpy(gp + code_bytes_ + 2 * c, &s, 2);
    if (!format_.symmetric) gp[code_bytes_ + 2 * kPanel + c] = zeros[g];
    for (int64_t kk = 0; kk < G; ++kk) {
      const int64_t k = g * G + kk;
      const uint8_t u =
          k < k_ ? codes[k]
                 : (format_.symmetric
                        ? static_cast<uint8_t>(1 << (format_.bits - 1))
                        : zeros[g]);
      int nibble;
      const int64_t off = CodeOffset(format_.bits, c, kk, &nibble);
      if (format_.bits == 8) {
        gp[off] = static_cast<char>(u);
      } else {
        uint8_t byte = static_cast<uint8_t>(gp[off]);
        byte = static_cast<uint8_t>((byte & ~(15 << (4 * nibble))) |
                                    ((u & 15) << (4 * nibble)));
        gp[off] = static_cast<char>(byte);
      }
    }
  }
}

void QuantizedMatrix::QuantizeRow(int64_t n, const float* row) {
  const int64_t G = format_.group_size;
  const int bits = format_.bits;
  const int levels = (1 << bits) - 1;
  std::vector<uint8_t> codes(k_);
  std::vector<float> scales(groups_);
  std::vector<uint8_t> zeros(groups_);
  for (int64_t g = 0; g < groups_; ++g) {
    const int64_t k0 = g * G, k1 = std::min(k_, k0 + G);
    float scale;
    int zero;
    if (format_.symmetric) {
      zero = 1 << (bits - 1);
      // int8: max|w| -> +-127 (Q8_0). int4: the weight of largest magnitude
      // -> -8 (Q4_0), so that the full code range [-8, 7] is used.
      float big = 0.0f;
      for (int64_t k = k0; k < k1; ++k) {
        if (std::fabs(row[k]) > std::fabs(big)) big = row[k];
      }
      scale = bits == 8 ? std::fabs(big) / 127.0f : big / -8.0f;
    } else {
      float lo = 0.0f, hi = 0.0f;  // the range includes 0
      for (int64_t k = k0; k < k1; ++k) {
        lo = std::min(lo, row[k]);
        hi = std::max(hi, row[k]);
      }
      scale = (hi - lo) / static_cast<float>(levels);
      const float s16 = F16ToF32(ToF16(scale));
      zero = s16 != 0.0f
                 ? std::clamp(static_cast<int>(std::nearbyint(-lo / s16)), 0,
                              levels)
                 : 0;
    }
    scale = F16ToF32(ToF16(scale));  // quantize against the stored scale
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    const int qmin = format_.symmetric ? (bits == 8 ? 1 : 0) : 0;
    for (int64_t k = k0; k < k1; ++k) {
      const int q = static_cast<int>(std::nearbyint(row[k] * inv)) + zero;
      codes[k] = static_cast<uint8_t>(std::clamp(q, qmin, levels));
    }
    scales[g] = scale;
    zeros[g] = static_cast<uint8_t>(zero);
  }
  SetCodes(n, codes.data(), scales.data(), zeros.data());
}

void QuantizedMatrix::RoundTrip(const QuantFormat& format, int64_t k,
                                const float* row, float* out) {
  QuantizedMatrix one(1, k, format);
  one.QuantizeRow(0, row);
  one.GetRow(0, out);
}

int QuantizedMatrix::Code(int64_t n, int64_t k) const {
  const int64_t G = format_.group_size;
  const char* gp = GroupAt(n, k / G);
  int nibble;
  const int64_t off =
      CodeOffset(format_.bits, static_cast<int>(n % kPanel), k % G, &nibble);
  const uint8_t byte = static_cast<uint8_t>(gp[off]);
  return format_.bits == 8 ? byte : (byte >> (4 * nibble)) & 15;
}

float QuantizedMatrix::Scale(int64_t n, int64_t group) const {
  uint16_t s;
  std::memcpy(&s, GroupAt(n, group) + code_bytes_ + 2 * (n % kPanel), 2);
  return F16ToF32(s);
}

int QuantizedMatrix::Zero(int64_t n, int64_t group) const {
  if (format_.symmetric) return 1 << (format_.bits - 1);
  return static_cast<uint8_t>(
      GroupAt(n, group)[code_bytes_ + 2 * kPanel + n % kPanel]);
}

void QuantizedMatrix::GetRow(int64_t n, float* out) const {
  const int64_t G = format_.group_size;
  for (int64_t k = 0; k < k_; ++k) {
    out[k] = Scale(n, k / G) * static_cast<float>(Code(n, k) - Zero(n, k / G));
  }
}

void QuantMatMul(ThreadPool& pool, const float* x, int64_t M, int64_t ldx,
                 const QuantizedMatrix& w, const float* bias, float* y,
                 int64_t ldy) {
  if (M <= 0) return;
  const QuantKernel kernel = ChooseKernel(M);
  // Quantize with AVX-512 where the kernel is an AVX-512 one, with AVX2
  // where it is the AVX2 one (the same codes every way).
  const bool vnni = kernel == QuantKernel::kVnni || kernel == QuantKernel::kAmx;
  const int64_t G = w.format().group_size;
  // The caller's buffers (a lambda naming a thread_local would reach each
  // pool thread's own instance, hence the reference).
  thread_local QuantizedRows caller_rows;
  QuantizedRows& rows = caller_rows;
  rows.ldq = w.groups() * G;
  rows.ldb = rows.ldq / kBlock;
  // AMX reads whole row groups: zero codes pad the last one.
  const int64_t padded_rows =
      kernel == QuantKernel::kAmx ? RoundUp(M, kAmxRowGroup) : M;
  if (static_cast<int64_t>(rows.q.size()) < padded_rows * rows.ldq) {
    rows.q.resize(padded_rows * rows.ldq);
  }
  if (static_cast<int64_t>(rows.scale.size()) < M * rows.ldb) {
    rows.scale.resize(M * rows.ldb);
    rows.sum.resize(M * rows.ldb);
  }
  std::fill(rows.q.begin() + M * rows.ldq,
            rows.q.begin() + padded_rows * rows.ldq, int8_t{0});
  auto quantize = [&](int64_t b, int64_t e, int) {
    for (int64_t m = b; m < e; ++m) {
      (vnni                           ? QuantizeRowAvx512
       : kernel == QuantKernel::kAvx2 ? cpu_internal::QuantizeRowAvx2
                                      : QuantizeRowScalar)(
          x + m * ldx, w.k(), rows.ldb, rows.q.data() + m * rows.ldq,
          rows.scale.data() + m * rows.ldb, rows.sum.data() + m * rows.ldb);
    }
  };
  if (M >= 16) {
    pool.ParallelFor(M, quantize);
  } else {
    quantize(0, M, 0);
  }
  constexpr int64_t kChunkBytes = 256 << 10;
  const int64_t panels = w.num_panels();
  const int64_t per_chunk = std::clamp<int64_t>(
      kChunkBytes / std::max<int64_t>(1, w.bytes() / panels), 1,
      std::max<int64_t>(1, panels / (4 * pool.num_threads())));
  const int64_t chunks = (panels + per_chunk - 1) / per_chunk;
  std::atomic<int64_t> next_chunk{0};
  const int bits = w.format().bits;
  const bool asym = !w.format().symmetric;
  pool.ParallelFor(
      std::min<int64_t>(chunks, pool.num_threads()),
      [&](int64_t, int64_t, int) {
        std::optional<AmxTileScope> tiles;
        if (kernel == QuantKernel::kAmx) tiles.emplace();
        for (int64_t chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
             chunk < chunks;
             chunk = next_chunk.fetch_add(1, std::memory_order_relaxed)) {
          for (int64_t p = chunk * per_chunk;
               p < std::min(panels, (chunk + 1) * per_chunk); ++p) {
            const int valid =
                static_cast<int>(std::min<int64_t>(kPanel, w.n() - p * kPanel));
            __mmask16 masks[4];
            for (int c = 0; c < 4; ++c) {
              const int n = std::clamp(valid - 16 * c, 0, 16);
              masks[c] = static_cast<__mmask16>((1u << n) - 1u);
            }
            float* yp = y + p * kPanel;
            const QuantPanelArgs args{rows.q.data(),
                                      rows.scale.data(),
                                      rows.sum.data(),
                                      rows.ldq,
                                      rows.ldb,
                                      w.panel(p),
                                      w.groups(),
                                      G / kBlock,
                                      w.code_bytes(),
                                      w.group_bytes(),
                                      yp,
                                      ldy,
                                      masks};
            if (kernel == QuantKernel::kScalar) {
              PanelScalar(w, args, M, valid);
            } else if (kernel == QuantKernel::kAvx2) {
              cpu_internal::QuantPanelAvx2(args, M, valid, bits, asym);
            } else if (kernel == QuantKernel::kAmx) {
              QuantPanelAmx(args, M, bits, asym);
            } else if (bits == 8) {
              asym ? PanelVnni<8, true>(args, M) : PanelVnni<8, false>(args, M);
            } else {
              asym ? PanelVnni<4, true>(args, M) : PanelVnni<4, false>(args, M);
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
