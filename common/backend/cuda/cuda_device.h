// What the rest of the project may ask of the CUDA backend without including
// CUDA headers: whether a device is usable, and the reference probes that
// `bench-engine --device=cuda` prints next to the engine's figures (a
// device-to-device copy and a cuBLAS GEMM). Implemented by cuda_loader.cc,
// which forwards to the libpdserve_cuda.so plugin (cuda_plugin.h) or returns
// FAILED_PRECONDITION saying why it cannot ("built without CUDA", plugin not
// found, no device). Thread-compatible.
#ifndef PDSERVE_COMMON_BACKEND_CUDA_CUDA_DEVICE_H_
#define PDSERVE_COMMON_BACKEND_CUDA_CUDA_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/dtype.h"

namespace pdserve {

// True when this binary was compiled with the CUDA backend.
bool BuiltWithCuda();

// OK when a CUDA device is usable; FAILED_PRECONDITION otherwise, with
// "--device=cuda but no CUDA device: <cudaGetErrorString>" or "built without
// CUDA".
absl::Status CheckCudaDevice();

// Name and memory of device 0 ("NVIDIA H200, 139.8 GiB, sm_90").
absl::StatusOr<std::string> CudaDeviceDescription();

// Device-to-device cudaMemcpy of `bytes`, best of `reps`: (read + written
// bytes) / s in GB/s, i.e. 2 * bytes / time.
absl::StatusOr<double> MeasureCudaCopyGbps(int64_t bytes, int reps);

// cuBLAS GEMM y[m][n] = x[m][k] * W[n][k]^T in `dtype` (bf16 in / f32 out /
// f32 accumulate, or f32), best of `reps`, in GFLOP/s (2mnk / s).
absl::StatusOr<double> MeasureCublasGemmGflops(int64_t m, int64_t n, int64_t k,
                                               DType dtype, int reps);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CUDA_CUDA_DEVICE_H_
