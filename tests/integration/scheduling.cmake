# Scheduling and KV memory at scale (issue 5): prefix-aware routing and the
# prefill worker's prefix cache; admission control. Uses the cluster harness
# of service.cmake.
if(TARGET pdserve_client)
  foreach(name service_prefix service_admission)
    pdserve_add_test(${name}_test
      SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/${name}_test.cc
      LIBS pdserve_cluster_harness
      LABELS integration)
  endforeach()
endif()
