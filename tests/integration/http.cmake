# The router's OpenAI-compatible HTTP API (issue 14): raw-socket tests against
# a real cluster (service_http_test).
add_library(pdserve_http_test_client STATIC
  ${CMAKE_SOURCE_DIR}/tests/integration/http_test_client.cc)
target_link_libraries(pdserve_http_test_client PUBLIC absl::status
  absl::statusor absl::strings absl::time)
pdserve_add_cluster_tests(NAMES service_http LIBS pdserve_http_test_client)
