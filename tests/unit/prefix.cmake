pdserve_add_test(prefix_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/prefix_test.cc
  LIBS pdserve_engine LABELS engine)
