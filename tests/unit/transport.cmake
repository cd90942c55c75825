if(TARGET pdserve_transport)
  pdserve_add_test(transport_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/transport_test.cc
    LIBS pdserve_transport pdserve_grpc_util)
  pdserve_add_test(ucx_transport_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/ucx_transport_test.cc
    LIBS pdserve_transport pdserve_grpc_util)
endif()
