// The CUDA backend is a plugin: libpdserve_cuda.so holds the kernels, the
// runner and everything that links the CUDA runtime and cuBLAS, and the
// engine loads it with dlopen only when --device=cuda asks for it
// (cuda_loader.cc). So `pdserve` itself never links CUDA libraries: it runs on
// machines without them, and their load-time side effects stay out of
// CPU-only processes. This header is the contract between the two sides:
// both are built by this project with the same compiler and Abseil, so C++
// types cross it. The plugin is never unloaded. Thread-compatible.
#ifndef PDSERVE_COMMON_BACKEND_CUDA_CUDA_PLUGIN_H_
#define PDSERVE_COMMON_BACKEND_CUDA_CUDA_PLUGIN_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/backend/model_runner.h"
#include "common/model/dtype.h"

namespace pdserve {

// Bumped whenever a field below changes meaning or signature.
inline constexpr int kCudaPluginApiVersion = 1;

struct CudaPluginApi {
  int version = kCudaPluginApiVersion;
  absl::Status (*check_device)();
  absl::StatusOr<std::string> (*device_description)();
  absl::StatusOr<double> (*copy_gbps)(int64_t bytes, int reps);
  absl::StatusOr<double> (*gemm_gflops)(int64_t m, int64_t n, int64_t k,
                                        DType dtype, int reps);
  absl::StatusOr<std::unique_ptr<ModelRunner>> (*create_runner)(
      ModelSource& source, const RunnerOptions& options);
};

// The implementations inside the plugin (also linked directly by the GPU
// unit tests, which exercise the kernels without the loader).
namespace cuda_impl {
absl::Status CheckCudaDevice();
absl::StatusOr<std::string> CudaDeviceDescription();
absl::StatusOr<double> MeasureCudaCopyGbps(int64_t bytes, int reps);
absl::StatusOr<double> MeasureCublasGemmGflops(int64_t m, int64_t n, int64_t k,
                                               DType dtype, int reps);
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(
    ModelSource& source, const RunnerOptions& options);
}  // namespace cuda_impl

}  // namespace pdserve

// The plugin's one exported symbol.
#define PDSERVE_CUDA_PLUGIN_ENTRY "pdserve_cuda_plugin_api"
extern "C" const pdserve::CudaPluginApi* pdserve_cuda_plugin_api();

#endif  // PDSERVE_COMMON_BACKEND_CUDA_CUDA_PLUGIN_H_
