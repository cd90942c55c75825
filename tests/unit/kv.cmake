pdserve_add_test(kv_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/kv_test.cc
  LIBS pdserve_kv LABELS engine)
