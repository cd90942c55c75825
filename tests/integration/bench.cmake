# Short end-to-end run of `pdserve bench` against a `pdserve up` cluster on
# the bundled stories260K model (a few seconds; no timing assertions).
if(TARGET pdserve AND TARGET pdserve_loadgen_core)
  pdserve_add_test(bench_e2e_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/bench_e2e_test.cc
    LIBS pdserve_loadgen_core pdserve_util
    LABELS integration)
  target_compile_definitions(bench_e2e_test PRIVATE
    PDSERVE_BINARY="$<TARGET_FILE:pdserve>")
  add_dependencies(bench_e2e_test pdserve)
endif()
