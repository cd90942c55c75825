# UCX KV transport (issue 18). The service's exactness, failure,
# cancellation and migration tests run again with every worker on
# --kv_transport=ucx (no fallback: a push that cannot go over UCX fails),
# once with UCX's default transports and once with UCX_TLS=tcp (labels
# integration, names prefixed ucx. and ucx_tcp.; the cluster harness reads
# PDSERVE_TEST_KV_TRANSPORT).
# service_ucx checks what only UCX has (transport chosen, endpoints and
# registrations released when a peer dies); service_ucx_netns runs P and D in
# two network namespaces joined by a veth pair (needs root and iproute2).
foreach(name service_exactness service_failure service_input
             service_migration service_migration_cancel)
  if(TARGET ${name}_test)
    # (One value per property: gtest_discover_tests splits lists.)
    gtest_discover_tests(${name}_test TEST_PREFIX "ucx."
      WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} DISCOVERY_TIMEOUT 60
      PROPERTIES LABELS integration
                 ENVIRONMENT "PDSERVE_TEST_KV_TRANSPORT=ucx")
    gtest_discover_tests(${name}_test TEST_PREFIX "ucx_tcp."
      WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} DISCOVERY_TIMEOUT 60
      PROPERTIES LABELS integration
                 ENVIRONMENT "PDSERVE_TEST_KV_TRANSPORT=ucx"
                 ENVIRONMENT_MODIFICATION "UCX_TLS=set:tcp")
  endif()
endforeach()
pdserve_add_cluster_tests(NAMES service_ucx service_ucx_netns
  LIBS pdserve_transport)
