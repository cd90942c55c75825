// The engine's side of the CUDA plugin (cuda_plugin.h): finds
// libpdserve_cuda.so, loads it once with dlopen, and forwards the functions
// of cuda_device.h and CreateCudaRunner to it. Without the plugin every entry
// point returns FAILED_PRECONDITION saying why. Thread-safe (the load happens
// once, under a static initializer).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/backend/cuda/cuda_device.h"
#include "common/backend/cuda/cuda_plugin.h"

namespace pdserve {
namespace {

constexpr char kPluginFile[] = "libpdserve_cuda.so";

std::string ExecutableDir() {
  std::string path(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (n <= 0) return "";
  path.resize(n);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// Where the plugin may be: $PDSERVE_CUDA_PLUGIN, next to the executable (the
// build directory and an install's bin/), one level up (test binaries under
// build/tests/), the build directory this was compiled for, then the dynamic
// loader's own search path.
std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("PDSERVE_CUDA_PLUGIN"); env && *env) {
    out.push_back(env);
  }
  const std::string dir = ExecutableDir();
  if (!dir.empty()) {
    out.push_back(absl::StrCat(dir, "/", kPluginFile));
    out.push_back(absl::StrCat(dir, "/../", kPluginFile));
    out.push_back(absl::StrCat(dir, "/../lib/", kPluginFile));
  }
#ifdef PDSERVE_CUDA_PLUGIN_BUILD_PATH
  out.push_back(PDSERVE_CUDA_PLUGIN_BUILD_PATH);
#endif
  out.push_back(kPluginFile);
  return out;
}

struct Loaded {
  const CudaPluginApi* api = nullptr;
  absl::Status status;
};

const Loaded& Plugin() {
  static const Loaded loaded = [] {
    Loaded l;
#ifndef PDSERVE_CUDA_PLUGIN_BUILD_PATH
    l.status = absl::FailedPreconditionError(
        "--device=cuda but pdserve was built without CUDA (configure with "
        "-DPDSERVE_CUDA=ON where nvcc is installed)");
    return l;
#endif
    std::vector<std::string> errors;
    for (const std::string& path : Candidates()) {
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* err = dlerror();
        errors.push_back(err ? err : path);
        continue;
      }
      auto entry = reinterpret_cast<const CudaPluginApi* (*)()>(
          dlsym(handle, PDSERVE_CUDA_PLUGIN_ENTRY));
      const CudaPluginApi* api = entry ? entry() : nullptr;
      if (api == nullptr || api->version != kCudaPluginApiVersion) {
        errors.push_back(absl::StrCat(path,
                                      ": not a compatible pdserve CUDA "
                                      "plugin (API version ",
                                      kCudaPluginApiVersion, " expected)"));
        continue;
      }
      l.api = api;
      return l;
    }
    l.status = absl::FailedPreconditionError(
        absl::StrCat("--device=cuda but the CUDA backend (", kPluginFile,
                     ") could not be loaded: ", absl::StrJoin(errors, "; ")));
    return l;
  }();
  return loaded;
}

}  // namespace

bool BuiltWithCuda() {
#ifdef PDSERVE_CUDA_PLUGIN_BUILD_PATH
  return true;
#else
  return false;
#endif
}

absl::Status CheckCudaDevice() {
  if (!Plugin().api) return Plugin().status;
  return Plugin().api->check_device();
}

absl::StatusOr<std::string> CudaDeviceDescription() {
  if (!Plugin().api) return Plugin().status;
  return Plugin().api->device_description();
}

absl::StatusOr<double> MeasureCudaCopyGbps(int64_t bytes, int reps) {
  if (!Plugin().api) return Plugin().status;
  return Plugin().api->copy_gbps(bytes, reps);
}

absl::StatusOr<double> MeasureCublasGemmGflops(int64_t m, int64_t n, int64_t k,
                                               DType dtype, int reps) {
  if (!Plugin().api) return Plugin().status;
  return Plugin().api->gemm_gflops(m, n, k, dtype, reps);
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(
    ModelSource& source, const RunnerOptions& options) {
  if (!Plugin().api) return Plugin().status;
  return Plugin().api->create_runner(source, options);
}

}  // namespace pdserve
