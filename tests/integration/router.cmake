# Router behaviour with real processes (issue 5): migration of a stream when
# its decode worker dies (also meeting a client cancel or a deadline), and
# the measured --mode=auto policy. Uses the cluster harness of service.cmake.
if(TARGET pdserve_client)
  foreach(name service_migration service_migration_cancel service_auto_mode)
    pdserve_add_test(${name}_test
      SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/${name}_test.cc
      LIBS pdserve_cluster_harness pdserve_metrics
      LABELS integration)
  endforeach()
endif()
