#include "common/backend/cpu/quantized_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace pdserve::cpu_internal {
namespace {

constexpr int kPanel = 64;
constexpr int kBlock = 32;
constexpr int64_t kPrefetchBytes = 4096;

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

// Byte offset of strip s (columns 8s..8s+7) in a quad of k (4 codes per
// column, one 32-bit lane each). int8: column c at (c / 16) * 64 + (c % 16)
// * 4; int4: the nibble c / 16 % 2 of byte (c / 32) * 64 + (c % 16) * 4.
template <int kBits>
constexpr int StripOffset(int s) {
  return kBits == 8 ? (8 * s / 16) * 64 + (8 * s % 16) * 4
                    : (8 * s / 32) * 64 + (8 * s % 16) * 4;
}

// The one-row kernels stream the panel once: software prefetch of the
// block kPrefetchBytes ahead.
template <int kBlockCodeBytes>
inline void PrefetchAhead(const char* codes) {
  for (int line = 0; line < kBlockCodeBytes; line += 64) {
    _mm_prefetch(codes + kPrefetchBytes + line, _MM_HINT_T0);
  }
}

// The first kPrefetchBytes of a panel, which PrefetchAhead does not reach
// when the panel starts a thread's chunk (a demand miss per line until the
// hardware prefetcher catches up; quantized products are short enough that
// these starts weigh).
inline void PrefetchPanelHead(const char* panel) {
  for (int line = 0; line < kPrefetchBytes; line += 64) {
    _mm_prefetch(panel + line, _MM_HINT_T0);
  }
}

// Strip s's (columns 8s..8s+7) f16 scales and, asymmetric, zero points.
inline __m256 StripScales(const uint16_t* sp, int s) {
  return _mm256_cvtph_ps(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 8 * s)));
}
template <bool kAsym>
inline __m256i StripZeros(const uint8_t* zp, int s) {
  if constexpr (!kAsym) return _mm256_setzero_si256();
  int64_t z8;
  std::memcpy(&z8, zp + 8 * s, 8);
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(z8));
}

// The documented epilogue of one row's block on one strip:
// acc = fma(float(isum - zero * xsum), scale * xs, acc).
template <int kBits, bool kAsym>
inline void AccumulateStrip(__m256i isum, __m256 sw, __m256i zero8,
                            int32_t xsum, __m256 sx, float* acc) {
  constexpr int32_t kZero = 1 << (kBits - 1);
  const __m256i corr = kAsym
                           ? _mm256_mullo_epi32(zero8, _mm256_set1_epi32(xsum))
                           : _mm256_set1_epi32(kZero * xsum);
  const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, corr));
  _mm256_store_ps(
      acc, _mm256_fmadd_ps(v, _mm256_mul_ps(sw, sx), _mm256_load_ps(acc)));
}

// R rows x strips [s0, s0 + NS) over every group and block. Per lane (a
// column) and block the integer sum of u * q over 32 k: int8 widens the
// codes and activations to 16 bits (vpmaddwd: exact, two k per int32,
// pairs added at the block's end); int4 multiplies bytes (vpmaddubsw:
// 15 * 127 * 2 cannot saturate) and adds the pairs with vpmaddwd.
template <int R, int NS, int kBits, bool kAsym>
inline void Kernel(const QuantPanelArgs& a, int s0) {
  constexpr int kBlockCodeBytes = kBits == 8 ? 2048 : 1024;  // 8 quads
  constexpr int kQuadBytes = kBits == 8 ? 256 : 128;
  const __m256i nib = _mm256_set1_epi8(0x0f);
  const __m256i ones16 = _mm256_set1_epi16(1);
  alignas(32) float acc[R][NS][8] = {};
  for (int64_t g = 0; g < a.groups; ++g) {
    const char* gp = a.panel + g * a.group_bytes;
    const uint16_t* sp = reinterpret_cast<const uint16_t*>(gp + a.code_bytes);
    const uint8_t* zp =
        reinterpret_cast<const uint8_t*>(gp + a.code_bytes) + kPanel * 2;
    for (int64_t b = 0; b < a.blocks_per_group; ++b) {
      const int64_t blk = g * a.blocks_per_group + b;
      const char* cp = gp + b * kBlockCodeBytes;
      // The rows' activation codes of each quad, broadcast: int8 as 16-bit
      // (q0..q3 x4), int4 as bytes.
      __m256i xv[R][8];
      for (int r = 0; r < R; ++r) {
        for (int q = 0; q < 8; ++q) {
          int32_t xw;
          std::memcpy(&xw, a.xq + r * a.ldq + blk * kBlock + q * 4, 4);
          xv[r][q] = kBits == 8 ? _mm256_cvtepi8_epi16(_mm_set1_epi32(xw))
                                : _mm256_set1_epi32(xw);
        }
      }
      for (int s = 0; s < NS; ++s) {
        const int off = StripOffset<kBits>(s0 + s);
        __m256i isum[R];
        if constexpr (kBits == 8) {
          // Lanes 0-3 and 4-7, two partial sums per lane each.
          __m256i lo[R], hi[R];
          for (int r = 0; r < R; ++r) {
            lo[r] = _mm256_setzero_si256();
            hi[r] = _mm256_setzero_si256();
          }
          for (int q = 0; q < 8; ++q) {
            const char* p = cp + q * kQuadBytes + off;
            const __m256i w_lo = _mm256_cvtepu8_epi16(
                _mm_load_si128(reinterpret_cast<const __m128i*>(p)));
            const __m256i w_hi = _mm256_cvtepu8_epi16(
                _mm_load_si128(reinterpret_cast<const __m128i*>(p + 16)));
            for (int r = 0; r < R; ++r) {
              lo[r] =
                  _mm256_add_epi32(lo[r], _mm256_madd_epi16(w_lo, xv[r][q]));
              hi[r] =
                  _mm256_add_epi32(hi[r], _mm256_madd_epi16(w_hi, xv[r][q]));
            }
          }
          // [l0 l1 l4 l5 | l2 l3 l6 l7] -> lanes in order.
          for (int r = 0; r < R; ++r) {
            isum[r] =
                _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r], hi[r]), 0xd8);
          }
        } else {
          __m256i p16[R];
          for (int r = 0; r < R; ++r) p16[r] = _mm256_setzero_si256();
          for (int q = 0; q < 8; ++q) {
            const __m256i v = _mm256_load_si256(
                reinterpret_cast<const __m256i*>(cp + q * kQuadBytes + off));
            const __m256i codes =
                ((s0 + s) / 2) % 2 == 0
                    ? _mm256_and_si256(v, nib)
                    : _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            for (int r = 0; r < R; ++r) {
              // |pair| <= 2 * 15 * 127 and 8 quads <= 30480: int16 holds it.
              p16[r] = _mm256_add_epi16(p16[r],
                                        _mm256_maddubs_epi16(codes, xv[r][q]));
            }
          }
          for (int r = 0; r < R; ++r) {
            isum[r] = _mm256_madd_epi16(p16[r], ones16);
          }
        }
        const __m256 sw = StripScales(sp, s0 + s);
        const __m256i zero8 = StripZeros<kAsym>(zp, s0 + s);
        for (int r = 0; r < R; ++r) {
          AccumulateStrip<kBits, kAsym>(
              isum[r], sw, zero8, a.xsum[r * a.ldb + blk],
              _mm256_set1_ps(a.xs[r * a.ldb + blk]), acc[r][s]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < NS; ++s) {
      std::memcpy(a.y + r * a.ldy + 8 * (s0 + s), acc[r][s], 32);
    }
  }
}

// One row, int4, all 64 columns in one pass over the panel: each 32-byte
// load holds two strips (low nibbles: strip s, high: strip s + 2), so every
// code byte is loaded once and the panel streams line after line. The
// integer sums and the float epilogue are those of Kernel's int4 path
// (same bits); only the loads are shared. Kernel itself runs 2-4 rows.
template <bool kAsym>
inline void KernelInt4Row(const QuantPanelArgs& a) {
  constexpr int kBlockCodeBytes = 1024;  // 8 quads of 128 bytes
  constexpr int kQuadBytes = 128;
  const __m256i nib = _mm256_set1_epi8(0x0f);
  const __m256i ones16 = _mm256_set1_epi16(1);
  alignas(32) float acc[8][8] = {};
  PrefetchPanelHead(a.panel);
  for (int64_t g = 0; g < a.groups; ++g) {
    const char* gp = a.panel + g * a.group_bytes;
    const uint16_t* sp = reinterpret_cast<const uint16_t*>(gp + a.code_bytes);
    const uint8_t* zp =
        reinterpret_cast<const uint8_t*>(gp + a.code_bytes) + kPanel * 2;
    for (int64_t b = 0; b < a.blocks_per_group; ++b) {
      const int64_t blk = g * a.blocks_per_group + b;
      const char* cp = gp + b * kBlockCodeBytes;
      PrefetchAhead<kBlockCodeBytes>(cp);
      // Strip s sums in p16[s]; the load at byte 32 j of a quad holds strips
      // {0, 1, 4, 5}[j] (low nibbles) and the same + 2 (high nibbles).
      __m256i p16[8];
      for (int s = 0; s < 8; ++s) p16[s] = _mm256_setzero_si256();
      for (int q = 0; q < 8; ++q) {
        int32_t xw;
        std::memcpy(&xw, a.xq + blk * kBlock + q * 4, 4);
        const __m256i x = _mm256_set1_epi32(xw);
        const char* qp = cp + q * kQuadBytes;
        for (int j = 0; j < 4; ++j) {
          const int s = j % 2 + (j / 2) * 4;
          static_assert(StripOffset<4>(5) == 96 && StripOffset<4>(7) == 96);
          const __m256i v =
              _mm256_load_si256(reinterpret_cast<const __m256i*>(qp + 32 * j));
          p16[s] = _mm256_add_epi16(
              p16[s], _mm256_maddubs_epi16(_mm256_and_si256(v, nib), x));
          p16[s + 2] = _mm256_add_epi16(
              p16[s + 2],
              _mm256_maddubs_epi16(
                  _mm256_and_si256(_mm256_srli_epi16(v, 4), nib), x));
        }
      }
      const int32_t xsum = a.xsum[blk];
      const __m256 sx = _mm256_set1_ps(a.xs[blk]);
      for (int s = 0; s < 8; ++s) {
        AccumulateStrip<4, kAsym>(_mm256_madd_epi16(p16[s], ones16),
                                  StripScales(sp, s), StripZeros<kAsym>(zp, s),
                                  xsum, sx, acc[s]);
      }
    }
  }
  std::memcpy(a.y, acc, sizeof(acc));
}

// One row, int8, the first 32 x `halves` columns in one pass over the
// panel: each block's two halves of 4 strips (bytes 0-127 and 128-255 of
// every quad) run one after the other while the block is in L1, so the
// panel streams line after line. The activations split into nibbles,
// x = 16 h + l with l = x & 15 in [0, 15] and h = x >> 4 in [-8, 7], so the
// codes u multiply bytes without widening (vpmaddubsw). Over a block's 8
// quads the u * l pairs (0..7650 each) sum to at most 61200, which 16-bit
// lanes hold as unsigned; the u * h pairs (|.| <= 4080) to at most 32640,
// which they hold signed. The block's integer sum per lane is Kernel's
// (exact), so the float epilogue and the bits are too.
template <bool kAsym>
inline void KernelInt8Row(const QuantPanelArgs& a, int halves) {
  constexpr int kBlockCodeBytes = 2048;  // 8 quads of 256 bytes
  constexpr int kQuadBytes = 256;
  const __m256i nib = _mm256_set1_epi8(0x0f);
  const __m256i eight = _mm256_set1_epi8(8);
  alignas(32) float acc[8][8] = {};
  PrefetchPanelHead(a.panel);
  for (int64_t g = 0; g < a.groups; ++g) {
    const char* gp = a.panel + g * a.group_bytes;
    const uint16_t* sp = reinterpret_cast<const uint16_t*>(gp + a.code_bytes);
    const uint8_t* zp =
        reinterpret_cast<const uint8_t*>(gp + a.code_bytes) + kPanel * 2;
    for (int64_t b = 0; b < a.blocks_per_group; ++b) {
      const int64_t blk = g * a.blocks_per_group + b;
      const char* cp = gp + b * kBlockCodeBytes;
      PrefetchAhead<kBlockCodeBytes>(cp);
      // The block's 32 activation codes as low nibbles (unsigned) and high
      // nibbles (signed: (n ^ 8) - 8).
      alignas(32) int32_t lo_x[8], hi_x[8];
      const __m256i x = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(a.xq + blk * kBlock));
      _mm256_store_si256(reinterpret_cast<__m256i*>(lo_x),
                         _mm256_and_si256(x, nib));
      _mm256_store_si256(
          reinterpret_cast<__m256i*>(hi_x),
          _mm256_sub_epi8(
              _mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), nib),
                               eight),
              eight));
      const int32_t xsum = a.xsum[blk];
      const __m256 sx = _mm256_set1_ps(a.xs[blk]);
      for (int s0 = 0; s0 < 4 * halves; s0 += 4) {
        __m256i lo[4], hi[4];
        for (int s = 0; s < 4; ++s) {
          lo[s] = _mm256_setzero_si256();
          hi[s] = _mm256_setzero_si256();
        }
        for (int q = 0; q < 8; ++q) {
          const __m256i xl = _mm256_set1_epi32(lo_x[q]);
          const __m256i xh = _mm256_set1_epi32(hi_x[q]);
          for (int s = 0; s < 4; ++s) {
            const __m256i v =
                _mm256_load_si256(reinterpret_cast<const __m256i*>(
                    cp + q * kQuadBytes + StripOffset<8>(s0 + s)));
            lo[s] = _mm256_add_epi16(lo[s], _mm256_maddubs_epi16(v, xl));
            hi[s] = _mm256_add_epi16(hi[s], _mm256_maddubs_epi16(v, xh));
          }
        }
        for (int s = 0; s < 4; ++s) {
          // Lane c: its two unsigned 16-bit low sums plus 16 x its two
          // signed high sums.
          const __m256i isum = _mm256_add_epi32(
              _mm256_add_epi32(
                  _mm256_and_si256(lo[s], _mm256_set1_epi32(0xffff)),
                  _mm256_srli_epi32(lo[s], 16)),
              _mm256_madd_epi16(hi[s], _mm256_set1_epi16(16)));
          AccumulateStrip<8, kAsym>(isum, StripScales(sp, s0 + s),
                                    StripZeros<kAsym>(zp, s0 + s), xsum, sx,
                                    acc[s0 + s]);
        }
      }
    }
  }
  std::memcpy(a.y, acc, sizeof(float) * 32 * halves);
}

// QuantizeRowScalar's arithmetic (quantized_matrix.cc) eight floats at a
// time: the same amax, x * inv and round-half-even (MXCSR default, as
// std::nearbyint), so the same codes, scales and sums.
void QuantizeBlockAvx2(const float* x, int8_t* q, float* scale, int32_t* sum) {
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(_mm256_and_ps(v[i], abs_mask), amax);
  }
  __m128 m4 =
      _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float a = _mm_cvtss_f32(m4);
  const __m256 inv = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
  *scale = a / 127.0f;
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i c[4];
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm256_cvtps_epi32(
        _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], inv), lo), hi));
  }
  // Bytes in lane order [c0 0-3, c1 0-3, c2 0-3, c3 0-3 | the 4-7s].
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]),
                                           _mm256_packs_epi32(c[2], c[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(
                          bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]),
                                      _mm256_add_epi32(c[2], c[3]));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8),
                             _mm256_extracti128_si256(s8, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
  *sum = _mm_cvtsi128_si32(s4);
}

template <int kBits, bool kAsym>
void Panel(const QuantPanelArgs& args, int64_t M, int valid) {
  // Whole strips into a scratch row when the panel is partial (stores of
  // 8 columns), copied out after.
  alignas(32) float scratch[4 * kPanel];
  for (int64_t m = 0; m < M;) {
    const int rows =
        M - m == 1 ? 1 : static_cast<int>(std::min<int64_t>(4, M - m));
    QuantPanelArgs a = args;
    a.xq = args.xq + m * args.ldq;
    a.xs = args.xs + m * args.ldb;
    a.xsum = args.xsum + m * args.ldb;
    const bool partial = valid < kPanel;
    a.y = partial ? scratch : args.y + m * args.ldy;
    a.ldy = partial ? kPanel : args.ldy;
    // All 64 columns per call for several rows: each block's activations
    // are widened once for the 8 strips.
    switch (rows) {
      case 4:
        Kernel<4, 8, kBits, kAsym>(a, 0);
        break;
      case 3:
        Kernel<3, 8, kBits, kAsym>(a, 0);
        break;
      case 2:
        Kernel<2, 8, kBits, kAsym>(a, 0);
        break;
      default:
        if constexpr (kBits == 4) {
          KernelInt4Row<kAsym>(a);
        } else {
          KernelInt8Row<kAsym>(a, valid > 32 ? 2 : 1);
        }
        break;
    }
    if (partial) {
      for (int r = 0; r < rows; ++r) {
        std::memcpy(args.y + (m + r) * args.ldy, scratch + r * kPanel,
                    static_cast<size_t>(valid) * 4);
      }
    }
    m += rows;
  }
}

#pragma GCC pop_options

}  // namespace

void QuantizeRowAvx2(const float* x, int64_t k, int64_t blocks, int8_t* q,
                     float* scale, int32_t* sum) {
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock;
    if (i0 + kBlock <= k) {
      QuantizeBlockAvx2(x + i0, q + i0, scale + b, sum + b);
    } else {
      // The last block past k: zeros there leave amax, codes and sum as
      // they are.
      alignas(32) float padded[kBlock] = {};
      if (k > i0) std::memcpy(padded, x + i0, (k - i0) * sizeof(float));
      QuantizeBlockAvx2(padded, q + i0, scale + b, sum + b);
    }
  }
}

void QuantPanelAvx2(const QuantPanelArgs& a, int64_t M, int valid, int bits,
                    bool asym) {
  if (bits == 8) {
    asym ? Panel<8, true>(a, M, valid) : Panel<8, false>(a, M, valid);
  } else {
    asym ? Panel<4, true>(a, M, valid) : Panel<4, false>(a, M, valid);
  }
}

}  // namespace pdserve::cpu_internal
