// amx_bf16_probe: does AMX's bf16 tile product (tdpbf16ps) compute the bf16
// arithmetic pdserve defines (DESIGN.md "What is rounded where": per pair of
// k, high half first, two f32 FMAs each rounded to nearest even, DAZ/FTZ)?
// Multiplies random 16 x 16-pair tiles both ways and counts the output
// elements whose bits differ, with and without subnormal inputs. Prints why
// it cannot run where the CPU or the kernel lacks AMX. Single-threaded.
//
//   build/tools/amx_bf16_probe [--trials=200]
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

namespace {

constexpr int kRows = 16, kCols = 16, kPairs = 16;

float BitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

uint32_t Bf16Bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u >> 16;  // truncation is enough for random operands
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// c[16][16] += a[16 rows][16 pairs] . b[16 pairs][16 cols] on AMX.
__attribute__((target("amx-tile,amx-bf16"))) void TileProduct(const uint32_t* a,
                                                              const uint32_t* b,
                                                              float* c) {
  TileConfig cfg;
  cfg.rows[0] = kRows;
  cfg.colsb[0] = kCols * 4;
  cfg.rows[1] = kRows;
  cfg.colsb[1] = kPairs * 4;
  cfg.rows[2] = kPairs;
  cfg.colsb[2] = kCols * 4;
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes only, so
  // the stores of the rest of the configuration could be dropped.
  asm volatile("ldtilecfg %0" : : "m"(cfg));
  _tile_loadd(0, c, kCols * 4);
  _tile_loadd(1, a, kPairs * 4);
  _tile_loadd(2, b, kCols * 4);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, c, kCols * 4);
  _tile_release();
}

// pdserve's definition, under DAZ|FTZ set by the caller.
float PairDots(float acc, const uint32_t* a, const uint32_t* b, int stride) {
  for (int k = 0; k < kPairs; ++k) {
    const uint32_t x = a[k], w = b[k * stride];
    acc = std::fma(BitsToFloat(x & 0xffff0000u), BitsToFloat(w & 0xffff0000u),
                   acc);
    acc = std::fma(BitsToFloat(x << 16), BitsToFloat(w << 16), acc);
  }
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--trials=", 9) == 0) {
      trials = std::atoi(argv[i] + 9);
    } else {
      std::fprintf(stderr, "usage: amx_bf16_probe [--trials=N]\n");
      return 2;
    }
  }
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("amx-bf16")) {
    std::printf("this CPU has no AMX-BF16: nothing to probe\n");
    return 0;
  }
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0) {
    std::printf("the kernel refused AMX tile state (arch_prctl): %s\n",
                std::strerror(errno));
    return 0;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 1);
  for (bool subnormal : {false, true}) {
    int differ = 0, total = 0;
    for (int t = 0; t < trials; ++t) {
      const float tiny = subnormal && t % 3 == 0 ? 1e-38f : 1.0f;
      uint32_t a[kRows * kPairs], b[kPairs * kCols];
      for (auto& v : a) {
        v = Bf16Bits(normal(rng) * tiny) << 16 | Bf16Bits(normal(rng));
      }
      for (auto& v : b) {
        v = Bf16Bits(normal(rng)) << 16 | Bf16Bits(normal(rng) * tiny);
      }
      float c[kRows * kCols], want[kRows * kCols];
      for (auto& v : c) v = normal(rng);
      const unsigned csr = _mm_getcsr();
      _mm_setcsr(csr | 0x8040u);
      for (int m = 0; m < kRows; ++m) {
        for (int n = 0; n < kCols; ++n) {
          want[m * kCols + n] =
              PairDots(c[m * kCols + n], a + m * kPairs, b + n, kCols);
        }
      }
      _mm_setcsr(csr);
      TileProduct(a, b, c);
      for (int i = 0; i < kRows * kCols; ++i) {
        differ += std::memcmp(&c[i], &want[i], 4) != 0;
      }
      total += kRows * kCols;
    }
    std::printf(
        "%s: %d of %d elements (%.1f%%) differ from pdserve's bf16 "
        "definition\n",
        subnormal ? "with subnormal operands" : "normal operands", differ,
        total, 100.0 * differ / total);
  }
  return 0;
}
