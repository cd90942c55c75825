# Tokenizer tests: references, streaming, bad input; fuzz (also under ASan).
pdserve_add_test(tokenizer_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/tokenizer_test.cc
          ${CMAKE_SOURCE_DIR}/tests/unit/tokenizer_components_test.cc
  LIBS pdserve_tokenizer nlohmann_json::nlohmann_json)
pdserve_add_test(tokenizer_fuzz_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/tokenizer_fuzz_test.cc
  LIBS pdserve_tokenizer nlohmann_json::nlohmann_json
  LABELS fuzz)
# The fuzz test again under AddressSanitizer + UBSan, in the sanitizer build
# tree (only the fuzz targets are built there; tests/unit/asan_test.sh).
if(PDSERVE_BUILD_TESTS AND NOT PDSERVE_ASAN)
  add_test(NAME tokenizer_fuzz_asan
           COMMAND ${CMAKE_SOURCE_DIR}/tests/unit/asan_test.sh
                   ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/asan tokenizer_fuzz_test
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(tokenizer_fuzz_asan PROPERTIES LABELS "asan" TIMEOUT 900
                       RESOURCE_LOCK asan_build)
endif()
# `pdserve complete` with text prompts (runs the built binary).
if(TARGET pdserve)
  pdserve_add_test(tokenizer_complete_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/tokenizer_complete_test.cc
    LIBS pdserve_tokenizer nlohmann_json::nlohmann_json absl::strings)
  if(TARGET tokenizer_complete_test)
    target_compile_definitions(tokenizer_complete_test
      PRIVATE PDSERVE_BINARY="$<TARGET_FILE:pdserve>")
    add_dependencies(tokenizer_complete_test pdserve)
  endif()
endif()
