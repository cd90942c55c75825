pdserve_add_test(kv_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/kv_test.cc
  LIBS pdserve_kv LABELS engine)
# The same pool checks with huge pages turned off (PDSERVE_HUGE_PAGES=0).
if(TARGET kv_test)
  add_test(NAME kv_test_no_huge_pages COMMAND kv_test)
  set_tests_properties(kv_test_no_huge_pages PROPERTIES
    ENVIRONMENT PDSERVE_HUGE_PAGES=0 LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
# Export/import on the AVX2 block copies (CPUs without AVX-512; where the
# CPU has no AVX2 either, the element-wise path).
if(TARGET kv_test)
  add_test(NAME kv_test_avx2 COMMAND kv_test
    --gtest_filter=KvCache.ExportImport*)
  set_tests_properties(kv_test_avx2 PROPERTIES
    ENVIRONMENT PDSERVE_DISABLE_AVX512=1 LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  add_test(NAME kv_test_scalar COMMAND kv_test
    --gtest_filter=KvCache.ExportImport*)
  set_tests_properties(kv_test_scalar PROPERTIES
    ENVIRONMENT "PDSERVE_DISABLE_AVX512=1;PDSERVE_DISABLE_AVX2=1"
    LABELS engine WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
