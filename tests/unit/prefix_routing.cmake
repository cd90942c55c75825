if(TARGET pdserve_router)
  pdserve_add_test(prefix_routing_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/prefix_routing_test.cc
    LIBS pdserve_router)
endif()
