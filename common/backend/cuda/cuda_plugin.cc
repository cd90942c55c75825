// The exported entry point of libpdserve_cuda.so (see cuda_plugin.h).
#include "common/backend/cuda/cuda_plugin.h"

extern "C" __attribute__((visibility("default"))) const pdserve::CudaPluginApi*
pdserve_cuda_plugin_api() {
  static const pdserve::CudaPluginApi api = {
      pdserve::kCudaPluginApiVersion,
      &pdserve::cuda_impl::CheckCudaDevice,
      &pdserve::cuda_impl::CudaDeviceDescription,
      &pdserve::cuda_impl::MeasureCudaCopyGbps,
      &pdserve::cuda_impl::MeasureCublasGemmGflops,
      &pdserve::cuda_impl::CreateCudaRunner,
  };
  return &api;
}
