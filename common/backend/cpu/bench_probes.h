// Reference measurements that benchmarks print next to the engine's figures:
// the memory bandwidth a streaming read reaches, and the rate of oneDNN's
// matmul (when built with oneDNN) at a given shape. Not for the serving path.
// Thread-compatible (each call uses its own threads/buffers).
#ifndef PDSERVE_COMMON_BACKEND_CPU_BENCH_PROBES_H_
#define PDSERVE_COMMON_BACKEND_CPU_BENCH_PROBES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/thread_pool.h"
#include "common/model/dtype.h"

namespace pdserve {

// The sum of p[0, n) read with the widest vector loads this CPU has
// (AVX-512, else AVX2, else scalar; 4 independent accumulators): a plain
// streaming read, bound by memory rather than by its add chain.
float StreamingReadSum(const float* p, int64_t n);

// GB/s (1e9 bytes/s) of a plain streaming read: every thread of `pool` sums
// its contiguous share of a `bytes` buffer with StreamingReadSum. The buffer is
// allocated and written once, then read `reps` times; one figure per read.
std::vector<double> MeasureReadBandwidthGbps(ThreadPool& pool, int64_t bytes,
                                             int reps);

// GFLOP/s of oneDNN's matmul y[M][N] = x[M][K] * w[K][N] in `dtype` (bf16:
// bf16 inputs, f32 output), best of `reps` after a warm-up, with `threads`
// OpenMP threads. UNIMPLEMENTED when built without oneDNN.
absl::StatusOr<double> MeasureOneDnnGemmGflops(int64_t M, int64_t N, int64_t K,
                                               DType dtype, int threads,
                                               int reps);

// Peak resident set size of this process (VmHWM), bytes; -1 if unknown.
int64_t PeakRssBytes();
// Resets VmHWM to the current RSS (/proc/self/clear_refs "5"), so that a
// probe's freed buffer no longer counts; false if the kernel refused.
bool ResetPeakRss();

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_BENCH_PROBES_H_
