pdserve_add_test(scheduler_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/scheduler_test.cc
  LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS engine)
pdserve_add_test(scheduler_prompt_logprobs_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/scheduler_prompt_logprobs_test.cc
  LIBS pdserve_engine nlohmann_json::nlohmann_json LABELS engine)
