# CUDA backend tests. cuda_device_test runs everywhere (the clear error
# without a GPU, or without CUDA in the build); the `gpu`-labelled ones need a
# CUDA build and skip (GTEST_SKIP) when no GPU is usable: `ctest -L gpu`.
pdserve_add_test(cuda_device_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/cuda_device_test.cc
  LIBS pdserve_engine LABELS cuda)
if(PDSERVE_HAVE_CUDA)
  pdserve_add_test(cuda_kernels_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/cuda_kernels_test.cc
    LIBS pdserve_backend pdserve_cuda_impl CUDA::cudart LABELS gpu)
  pdserve_add_test(cuda_runner_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/cuda_runner_test.cc
    LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS gpu)
  # The runner test goes through the loader, which dlopens the plugin.
  add_dependencies(cuda_runner_test pdserve_cuda)
endif()
if(TARGET pdserve_cuda)
  add_dependencies(cuda_device_test pdserve_cuda)
endif()
