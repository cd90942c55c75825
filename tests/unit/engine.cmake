pdserve_add_test(engine_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/engine_test.cc
  LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS engine)
pdserve_add_test(engine_kv_transfer_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/engine_kv_transfer_test.cc
  LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS engine)
pdserve_add_test(accuracy_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/accuracy_test.cc
  LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS engine)
