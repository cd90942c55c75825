# Chat template engine: the shared references, the constructs generated with
# Python jinja2, extra templates; fuzz (also under ASan).
pdserve_add_test(chat_template_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/chat_template_test.cc
  LIBS pdserve_chat_template nlohmann_json::nlohmann_json)
