# Same-host shared-memory KV transport (issue 5): shm chosen automatically on
# one host, outputs identical to the gRPC transport and the reference, no
# leaked segments. Uses the cluster harness of service.cmake.
if(TARGET pdserve_client AND TARGET pdserve_metrics)
  pdserve_add_test(service_shm_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/service_shm_test.cc
    LIBS pdserve_cluster_harness pdserve_metrics pdserve_transport
    LABELS integration)
endif()
