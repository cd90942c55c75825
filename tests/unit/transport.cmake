if(TARGET pdserve_transport)
  pdserve_add_test(transport_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/transport_test.cc
    LIBS pdserve_transport pdserve_grpc_util)
  pdserve_add_test(ucx_transport_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/ucx_transport_test.cc
      ${CMAKE_SOURCE_DIR}/tests/unit/ucx_push_test.cc
      ${CMAKE_SOURCE_DIR}/tests/unit/ucx_in_place_test.cc
    LIBS pdserve_transport pdserve_grpc_util)
  if(PDSERVE_BUILD_TESTS)
    # A UCX peer in a process of its own, killed by ucx_transport_test.
    add_executable(ucx_peer_helper ${CMAKE_SOURCE_DIR}/tests/unit/ucx_peer_helper.cc)
    target_link_libraries(ucx_peer_helper PRIVATE pdserve_transport)
    add_dependencies(ucx_transport_test ucx_peer_helper)
    target_compile_definitions(ucx_transport_test PRIVATE
      PDSERVE_UCX_PEER_HELPER="$<TARGET_FILE:ucx_peer_helper>")
  endif()
endif()
