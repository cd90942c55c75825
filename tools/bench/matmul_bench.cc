// matmul_bench: thread CPU time of the linear layers of one forward pass
// (llama-110m shapes: 12 x qkv, o, gate|up, down; matrices far larger than
// the caches) per weight format, on one thread, for M = 1 (decode) and 16
// rows. CPU time, not wall time, so that a shared machine's scheduling does
// not enter (stalls on memory still count): the figure that says whether a
// kernel streams its bytes at the memory's rate.
//
//   build/tools/matmul_bench [--rows=1,16,64] [--formats=f32,bf16,int8,int4]
//                            [--layers=12]
//
// --layers=1 (7-27 MB by format) keeps the matrices in a large L3: the
// kernel's compute rate rather than the memory's.
// PDSERVE_QUANT_KERNEL=amx|vnni|avx2|scalar picks the int8/int4 kernel.
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/backend/cpu/packed_matrix.h"
#include "common/backend/cpu/quantized_matrix.h"
#include "common/model/quantization.h"

namespace pdserve {
namespace {

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

std::vector<std::string> SplitCommas(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int Run(const std::vector<int>& row_counts,
        const std::vector<std::string>& formats, int64_t L) {
  const int64_t H = 768, I = 2048;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  ThreadPool pool(1);
  struct Shape {
    int64_t n, k;
  };
  const Shape shapes[] = {{3 * H, H}, {H, H}, {2 * I, H}, {H, I}};
  for (int M : row_counts) {
    for (const std::string& mode : formats) {
      std::vector<PackedMatrix> dense;
      std::vector<QuantizedMatrix> quant;
      int64_t bytes = 0;
      std::vector<float> w(I);
      for (int l = 0; l < L; ++l) {
        for (const Shape& s : shapes) {
          if (mode == "f32" || mode == "bf16") {
            dense.emplace_back(s.n, s.k,
                               mode == "bf16" ? DType::kBF16 : DType::kF32);
            for (int64_t n = 0; n < s.n; ++n) {
              for (auto& v : w) v = u(rng);
              dense.back().SetRow(n, w.data());
            }
            bytes += dense.back().bytes();
          } else {
            quant.emplace_back(s.n, s.k, ParseQuantization(mode)->value());
            for (int64_t n = 0; n < s.n; ++n) {
              for (auto& v : w) v = u(rng);
              quant.back().QuantizeRow(n, w.data());
            }
            bytes += quant.back().bytes();
          }
        }
      }
      std::vector<float> x(M * I), y(M * 2 * I);
      for (auto& v : x) v = u(rng);
      double best = 1e9;
      for (int rep = 0; rep < 7; ++rep) {
        const double t0 = ThreadCpuSeconds();
        for (const PackedMatrix& d : dense) {
          MatMul(pool, x.data(), M, d.k(), d, nullptr, y.data(), d.n());
        }
        for (const QuantizedMatrix& q : quant) {
          QuantMatMul(pool, x.data(), M, q.k(), q, nullptr, y.data(), q.n());
        }
        best = std::min(best, ThreadCpuSeconds() - t0);
      }
      std::printf(
          "M=%-2d %-4s %6.1f MB  %7.2f ms CPU per pass (best of 7)  %5.1f GB "
          "per CPU-second\n",
          M, mode.c_str(), bytes / 1e6, best * 1e3, bytes / best / 1e9);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  std::vector<int> rows = {1, 16};
  std::vector<std::string> formats = {"f32", "bf16", "int8", "int4"};
  int layers = 12;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rows=", 7) == 0) {
      rows.clear();
      for (const std::string& r : pdserve::SplitCommas(argv[i] + 7)) {
        rows.push_back(std::atoi(r.c_str()));
      }
    } else if (std::strncmp(argv[i], "--formats=", 10) == 0) {
      formats = pdserve::SplitCommas(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--layers=", 9) == 0) {
      layers = std::atoi(argv[i] + 9);
      if (layers < 1 || layers > 64) {
        std::fprintf(stderr, "--layers: a count in 1..64\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: matmul_bench [--rows=1,16] "
                   "[--formats=f32,bf16,int8,int4] [--layers=12]\n"
                   "  (a format is f32, bf16 or a --quantization spelling: "
                   "int8, int8-g32, int4-g128, ...)\n");
      return 2;
    }
  }
  for (int m : rows) {
    if (m < 1 || m > 4096) {
      std::fprintf(stderr, "--rows: each count must be in 1..4096\n");
      return 2;
    }
  }
  for (const std::string& f : formats) {
    if (f == "f32" || f == "bf16") continue;
    auto q = pdserve::ParseQuantization(f);
    if (!q.ok() || !q->has_value()) {
      std::fprintf(stderr,
                   "--formats: f32, bf16 or a quantization (int8, int8-g32, "
                   "int4, int4-g32, ...), not %s\n",
                   f.c_str());
      return 2;
    }
  }
  return pdserve::Run(rows, formats, layers);
}
