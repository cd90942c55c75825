pdserve_add_test(backend_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/backend_test.cc
  LIBS pdserve_backend LABELS engine)
