# Scheduling and KV memory at scale (issue 5): prefix-aware routing and the
# prefill worker's prefix cache; admission control; chunked prefill. Uses the
# cluster harness of service.cmake.
if(TARGET pdserve_client)
  foreach(name service_prefix service_admission service_chunked)
    pdserve_add_test(${name}_test
      SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/${name}_test.cc
      LIBS pdserve_cluster_harness pdserve_metrics
      LABELS integration)
  endforeach()
endif()
