// CUDA device check and the bench-engine reference probes. NOT YET RUN ON A
// GPU (compiled only; on a machine without a driver CheckCudaDevice is what
// runs and it returns the FAILED_PRECONDITION).
#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/backend/cuda/cuda_plugin.h"
#include "common/backend/cuda/cuda_util.h"
#include "common/util/status_macros.h"

namespace pdserve {
namespace {

// Times `fn` (enqueueing work on `stream`) with CUDA events: best of `reps`
// after one warm-up, in seconds.
template <typename Fn>
absl::StatusOr<double> BestOf(int reps, cudaStream_t stream, Fn&& fn) {
  cudaEvent_t start, stop;
  RETURN_IF_ERROR(cuda::CudaStatus(cudaEventCreate(&start), "cudaEventCreate"));
  RETURN_IF_ERROR(cuda::CudaStatus(cudaEventCreate(&stop), "cudaEventCreate"));
  double best = 1e30;
  absl::Status status;
  for (int r = 0; r <= reps && status.ok(); ++r) {
    status.Update(cuda::CudaStatus(cudaEventRecord(start, stream), "record"));
    if (status.ok()) status.Update(fn());
    if (status.ok()) {
      status.Update(cuda::CudaStatus(cudaEventRecord(stop, stream), "record"));
    }
    if (status.ok()) {
      status.Update(cuda::CudaStatus(cudaEventSynchronize(stop), "sync"));
    }
    float ms = 0;
    if (status.ok()) {
      status.Update(
          cuda::CudaStatus(cudaEventElapsedTime(&ms, start, stop), "elapsed"));
    }
    if (status.ok() && r > 0) best = std::min(best, ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  return best;
}

}  // namespace

namespace cuda_impl {

absl::Status CheckCudaDevice() { return cuda::CheckDevicePresent(); }

absl::StatusOr<std::string> CudaDeviceDescription() {
  RETURN_IF_ERROR(CheckCudaDevice());
  cudaDeviceProp prop;
  RETURN_IF_ERROR(cuda::CudaStatus(cudaGetDeviceProperties(&prop, 0),
                                   "cudaGetDeviceProperties"));
  return absl::StrFormat("%s, %.1f GiB, sm_%d%d", prop.name,
                         prop.totalGlobalMem / 1073741824.0, prop.major,
                         prop.minor);
}

absl::StatusOr<double> MeasureCudaCopyGbps(int64_t bytes, int reps) {
  RETURN_IF_ERROR(CheckCudaDevice());
  ASSIGN_OR_RETURN(cuda::DevicePtr src, cuda::DeviceAlloc(bytes, "copy probe"));
  ASSIGN_OR_RETURN(cuda::DevicePtr dst, cuda::DeviceAlloc(bytes, "copy probe"));
  RETURN_IF_ERROR(cuda::CudaStatus(cudaMemset(src.get(), 1, bytes), "memset"));
  ASSIGN_OR_RETURN(double s, BestOf(reps, nullptr, [&] {
                     return cuda::CudaStatus(
                         cudaMemcpyAsync(dst.get(), src.get(), bytes,
                                         cudaMemcpyDeviceToDevice, nullptr),
                         "cudaMemcpyAsync");
                   }));
  return 2.0 * static_cast<double>(bytes) / s / 1e9;
}

absl::StatusOr<double> MeasureCublasGemmGflops(int64_t m, int64_t n, int64_t k,
                                               DType dtype, int reps) {
  RETURN_IF_ERROR(CheckCudaDevice());
  const bool bf16 = dtype == DType::kBF16;
  const int64_t esize = bf16 ? 2 : 4;
  ASSIGN_OR_RETURN(cuda::DevicePtr x, cuda::DeviceAlloc(m * k * esize, "gemm"));
  ASSIGN_OR_RETURN(cuda::DevicePtr w, cuda::DeviceAlloc(n * k * esize, "gemm"));
  ASSIGN_OR_RETURN(cuda::DevicePtr y, cuda::DeviceAlloc(m * n * 4, "gemm"));
  // 0x3c bytes: small finite values in both bf16 and f32.
  RETURN_IF_ERROR(
      cuda::CudaStatus(cudaMemset(x.get(), 0x3c, m * k * esize), "memset"));
  RETURN_IF_ERROR(
      cuda::CudaStatus(cudaMemset(w.get(), 0x3c, n * k * esize), "memset"));
  cublasHandle_t handle;
  RETURN_IF_ERROR(cuda::CublasStatus(cublasCreate(&handle), "cublasCreate"));
  auto s = BestOf(reps, nullptr, [&] {
    return cuda::GemmRowMajor(handle, x.get(), w.get(), bf16, m, n, k,
                              static_cast<float*>(y.get()), n);
  });
  cublasDestroy(handle);
  if (!s.ok()) return s.status();
  return 2.0 * m * n * k / *s / 1e9;
}

}  // namespace cuda_impl
}  // namespace pdserve
