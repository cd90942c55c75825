pdserve_add_test(loadgen_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/loadgen_test.cc
  LIBS pdserve_loadgen_core
  LABELS loadgen)
if(TARGET pdserve_loadgen)
  pdserve_add_test(loadgen_client_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/loadgen_client_test.cc
    LIBS pdserve_loadgen pdserve_grpc_util
    LABELS loadgen)
endif()
