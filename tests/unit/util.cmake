pdserve_add_test(util_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/util_test.cc LIBS pdserve_util)
pdserve_add_test(checksum_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/checksum_test.cc LIBS pdserve_util)
