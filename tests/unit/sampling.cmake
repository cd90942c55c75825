pdserve_add_test(sampling_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/sampling_test.cc
  LIBS pdserve_sampling LABELS engine)
