if(TARGET pdserve_router)
  pdserve_add_test(disaggregation_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/disaggregation_test.cc
    LIBS pdserve_router pdserve_util)
endif()
