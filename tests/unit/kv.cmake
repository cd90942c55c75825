pdserve_add_test(kv_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/kv_test.cc
  LIBS pdserve_kv LABELS engine)
# The same pool checks with huge pages turned off (PDSERVE_HUGE_PAGES=0).
if(TARGET kv_test)
  add_test(NAME kv_test_no_huge_pages COMMAND kv_test)
  set_tests_properties(kv_test_no_huge_pages PROPERTIES
    ENVIRONMENT PDSERVE_HUGE_PAGES=0 LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
