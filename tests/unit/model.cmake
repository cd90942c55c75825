pdserve_add_test(model_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/model_test.cc
  LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS engine)
pdserve_add_test(quant_checkpoint_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/quant_checkpoint_test.cc
  LIBS pdserve_engine LABELS engine)
