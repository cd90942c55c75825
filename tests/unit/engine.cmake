pdserve_add_test(engine_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/engine_test.cc
  LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS engine)
pdserve_add_test(engine_kv_transfer_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/engine_kv_transfer_test.cc
  LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS engine)
pdserve_add_test(accuracy_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/accuracy_test.cc
  LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS engine)
# The engine's bf16 batch invariance (compositions, reversed order,
# prefill/decode mixes, chunks of 1, 7 and 16) with every bf16 product on
# AMX tiles (PDSERVE_BF16_KERNEL=amx; skipped where the CPU has no AMX-BF16).
if(TARGET engine_test)
  add_test(NAME engine_test_amx_bf16 COMMAND engine_test
    --gtest_filter=BatchInvariance.*Bf16*:Bf16.*)
  set_tests_properties(engine_test_amx_bf16 PROPERTIES
    ENVIRONMENT PDSERVE_BF16_KERNEL=amx LABELS engine
    SKIP_REGULAR_EXPRESSION "AMX kernel is not exercised"
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
