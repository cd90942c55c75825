# Multi-process integration tests of the disaggregated service: each binary
# fork/execs build/pdserve roles on loopback (free ports) and kills them all.
if(TARGET pdserve_client)
  add_library(pdserve_cluster_harness STATIC
    ${CMAKE_SOURCE_DIR}/tests/integration/cluster_harness.cc)
  target_link_libraries(pdserve_cluster_harness PUBLIC pdserve_client
    pdserve_grpc_util pdserve_metrics pdserve_proto pdserve_util
    nlohmann_json::nlohmann_json)
  target_compile_definitions(pdserve_cluster_harness PRIVATE
    PDSERVE_BINARY="$<TARGET_FILE:pdserve>")
  add_dependencies(pdserve_cluster_harness pdserve)
endif()
pdserve_add_cluster_tests(NAMES service_exactness service_failure
  service_hardening service_input service_tls service_up service_quantized)
