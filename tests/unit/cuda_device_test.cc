// Runs everywhere (no GPU needed): asking for --device=cuda where no GPU is
// usable, or in a build without CUDA, is a clear FAILED_PRECONDITION, never a
// crash; an unknown device name is INVALID_ARGUMENT.
#include "common/backend/cuda/cuda_device.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "common/engine/engine.h"

namespace pdserve {
namespace {

EngineOptions CudaOptions() {
  EngineOptions o;
  o.model = "models/stories260K";
  o.device = "cuda";
  o.kv_cache_bytes = 4 << 20;
  return o;
}

TEST(CudaDevice, EngineOnCudaIsClearWhenUnavailable) {
  const absl::Status device = CheckCudaDevice();
  auto engine = Engine::Create(CudaOptions());
  if (device.ok()) {
    // A GPU is present: the engine must come up (the gpu tests check it).
    EXPECT_TRUE(engine.ok()) << engine.status();
    return;
  }
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine.status().message(), device.message());
  if (BuiltWithCuda()) {
    EXPECT_TRUE(absl::StartsWith(engine.status().message(),
                                 "--device=cuda but no CUDA device: "))
        << engine.status();
  } else {
    EXPECT_NE(engine.status().message().find("built without CUDA"),
              absl::string_view::npos)
        << engine.status();
  }
  std::printf("--device=cuda here: %s\n", engine.status().ToString().c_str());
}

TEST(CudaDevice, ProbesFailCleanlyWithoutDevice) {
  if (CheckCudaDevice().ok()) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(MeasureCudaCopyGbps(1 << 20, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      MeasureCublasGemmGflops(64, 64, 64, DType::kBF16, 1).status().code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(CudaDeviceDescription().ok());
}

TEST(CudaDevice, UnknownDeviceIsInvalidArgument) {
  EngineOptions o = CudaOptions();
  o.device = "tpu";
  auto engine = Engine::Create(o);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
