# Chat template engine: the shared references, the constructs generated with
# Python jinja2, extra templates; fuzz (also under ASan).
pdserve_add_test(chat_template_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/chat_template_test.cc
  LIBS pdserve_chat_template nlohmann_json::nlohmann_json)
pdserve_add_test(chat_template_fuzz_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/chat_template_fuzz_test.cc
  LIBS pdserve_chat_template nlohmann_json::nlohmann_json
  LABELS fuzz)
# The fuzz test again under AddressSanitizer + UBSan (tests/unit/asan_test.sh;
# the timeout covers building the sanitized library on a busy machine).
if(PDSERVE_BUILD_TESTS AND NOT PDSERVE_ASAN)
  add_test(NAME chat_template_fuzz_asan
           COMMAND ${CMAKE_SOURCE_DIR}/tests/unit/asan_test.sh
                   ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/asan chat_template_fuzz_test
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(chat_template_fuzz_asan PROPERTIES LABELS "asan" TIMEOUT 1800
                       RESOURCE_LOCK asan_build)
endif()
# `pdserve render-chat` (runs the built binary).
if(TARGET pdserve)
  pdserve_add_test(chat_template_cli_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/chat_template_cli_test.cc
    LIBS pdserve_chat_template pdserve_tokenizer nlohmann_json::nlohmann_json)
  if(TARGET chat_template_cli_test)
    target_compile_definitions(chat_template_cli_test
      PRIVATE PDSERVE_BINARY="$<TARGET_FILE:pdserve>")
    add_dependencies(chat_template_cli_test pdserve)
  endif()
endif()
