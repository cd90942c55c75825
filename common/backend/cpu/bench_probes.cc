#include "common/backend/cpu/bench_probes.h"

#include <immintrin.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/backend/cpu/packed_matrix.h"

#ifdef PDSERVE_HAVE_DNNL
#include "oneapi/dnnl/dnnl.hpp"
#endif

// GCC 12 reports its own intrinsics' `__m512 __Y = __Y;` idiom (masked
// loads, conversions, reductions) as (maybe-)uninitialized once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Each sums p[0, n - n % step) with `step` floats per iteration.
__attribute__((target("avx512f"))) float SumAvx512(const float* p, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

__attribute__((target("avx2"))) float SumAvx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes,
                  _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float l : lanes) s += l;
  return s;
}

float SumScalar(const float* p, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

}  // namespace

float StreamingReadSum(const float* p, int64_t n) {
  // Vector loads: a scalar sum is bound by its add chain, not memory.
  int64_t done = 0;
  float sum = 0;
  if (CpuHasAvx512()) {
    done = n / 64 * 64;
    sum = SumAvx512(p, done);
  } else if (CpuHasAvx2()) {
    done = n / 32 * 32;
    sum = SumAvx2(p, done);
  }
  return sum + SumScalar(p + done, n - done);
}

std::vector<double> MeasureReadBandwidthGbps(ThreadPool& pool, int64_t bytes,
                                             int reps) {
  const int64_t n = bytes / 4 / 4096 * 4096;
  AlignedBuffer buf = AllocateAligned(n * 4);
  float* p = reinterpret_cast<float*>(buf.get());
  pool.ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) p[i] = static_cast<float>(i & 7);
  });
  const int64_t chunks = n / 4096;
  std::vector<float> sink(pool.num_threads());
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Now();
    pool.ParallelFor(chunks, [&](int64_t b, int64_t e, int t) {
      const float* start = p + b * 4096;
      const int64_t len = (e - b) * 4096;
      sink[t] += StreamingReadSum(start, len);
    });
    const double dt = Now() - t0;
    gbps.push_back(static_cast<double>(n) * 4 / dt / 1e9);
  }
  volatile float keep = sink[0];
  (void)keep;
  return gbps;
}

absl::StatusOr<double> MeasureOneDnnGemmGflops(int64_t M, int64_t N, int64_t K,
                                               DType dtype, int threads,
                                               int reps) {
#ifdef PDSERVE_HAVE_DNNL
  try {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(eng);
    const dt in = dtype == DType::kBF16 ? dt::bf16 : dt::f32;
    dnnl::memory::desc src_md({M, K}, in, tag::ab);
    dnnl::memory::desc wei_md({K, N}, in, tag::any);
    dnnl::memory::desc dst_md({M, N}, dt::f32, tag::ab);
    dnnl::matmul::desc desc(src_md, wei_md, dst_md);  // oneDNN 2.x API
    dnnl::matmul::primitive_desc pd(desc, eng);
    dnnl::memory src(pd.src_desc(), eng), wei(pd.weights_desc(), eng),
        dst(pd.dst_desc(), eng);
    std::memset(src.get_data_handle(), 0, pd.src_desc().get_size());
    std::memset(wei.get_data_handle(), 0, pd.weights_desc().get_size());
    dnnl::matmul mm(pd);
    auto run = [&] {
      mm.execute(
          stream,
          {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
      stream.wait();
    };
    (void)threads;  // OpenMP threads: OMP_NUM_THREADS, set by the caller
    run();
    double best = 0;
    for (int r = 0; r < reps; ++r) {
      const double t0 = Now();
      run();
      const double dt_s = Now() - t0;
      best = std::max(best, 2.0 * M * N * K / dt_s / 1e9);
    }
    return best;
  } catch (const dnnl::error& e) {
    if (dtype == DType::kBF16 && e.status == dnnl_unimplemented) {
      return absl::UnimplementedError(
          "oneDNN has no bf16 matmul for this CPU (it needs AVX-512); no "
          "fraction of GEMM for bf16 here (--dtype=f32 has one)");
    }
    return absl::InternalError(std::string("oneDNN: ") + e.what());
  }
#else
  (void)M, (void)N, (void)K, (void)dtype, (void)threads, (void)reps;
  return absl::UnimplementedError("built without oneDNN");
#endif
}

int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace pdserve
