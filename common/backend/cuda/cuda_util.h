// Host-side helpers of the CUDA backend: cudaError_t/cublasStatus_t to
// absl::Status, RAII device and pinned-host buffers, the device check that
// gives `--device=cuda` its clear error. Internal to common/backend/cuda.
// Buffers are movable, not copyable; not thread-safe.
#ifndef PDSERVE_COMMON_BACKEND_CUDA_CUDA_UTIL_H_
#define PDSERVE_COMMON_BACKEND_CUDA_CUDA_UTIL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pdserve {
namespace cuda {

inline absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), " (",
                                          cudaGetErrorString(e), ")"));
}

inline absl::Status CublasStatus(cublasStatus_t s, absl::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusName(s),
                                          " (", cublasGetStatusString(s), ")"));
}

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct PinnedFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;
using PinnedPtr = std::unique_ptr<void, PinnedFree>;

inline absl::StatusOr<DevicePtr> DeviceAlloc(int64_t bytes,
                                             absl::string_view what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes > 0 ? bytes : 1);
  if (e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of ", bytes,
                                                     " bytes for ", what, ": ",
                                                     cudaGetErrorString(e)));
  }
  return DevicePtr(p);
}

inline absl::StatusOr<PinnedPtr> PinnedAlloc(int64_t bytes,
                                             absl::string_view what) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes > 0 ? bytes : 1);
  if (e != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMallocHost of ", bytes, " bytes for ", what, ": ",
                     cudaGetErrorString(e)));
  }
  return PinnedPtr(p);
}

// Row-major y[m][n] = x[m][k] . w[n][k]^T (w in Hugging Face layout) with
// cuBLAS: x and w both bf16 (bf16_inputs) or both f32; y f32, f32 accumulate
// (CUBLAS_COMPUTE_32F: no TF32). Rows of x and w are k apart, of y ldy apart.
// In cuBLAS' column-major terms: y^T = op_T(w) * x^T.
inline absl::Status GemmRowMajor(cublasHandle_t handle, const void* x,
                                 const void* w, bool bf16_inputs, int64_t m,
                                 int64_t n, int64_t k, float* y, int64_t ldy) {
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t in = bf16_inputs ? CUDA_R_16BF : CUDA_R_32F;
  return CublasStatus(
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                   static_cast<int>(m), static_cast<int>(k), &one, w, in,
                   static_cast<int>(k), x, in, static_cast<int>(k), &zero, y,
                   CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

// FAILED_PRECONDITION "--device=cuda but no CUDA device: <reason>" when the
// runtime finds no usable device (no driver, no GPU); OK otherwise.
inline absl::Status CheckDevicePresent() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=cuda but no CUDA device: ", cudaGetErrorString(e)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "--device=cuda but no CUDA device: cudaGetDeviceCount found 0 "
        "devices");
  }
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CUDA_CUDA_UTIL_H_
