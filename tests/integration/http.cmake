# Chat input and the router's OpenAI-compatible HTTP API: raw-socket tests
# against a real cluster (service_http_test; its logprobs in
# service_http_logprobs_test; connections and hostile clients in
# service_http_connections_test), the official OpenAI SDK for
# Node.js driving it (service_openai_sdk_test, tests/openai/*.mjs; installs
# the SDK with npm ci), chat over gRPC (service_chat_test), and what gRPC
# and HTTP clients see when the router stops (service_drain_test).
add_library(pdserve_http_test_client STATIC
  ${CMAKE_SOURCE_DIR}/tests/integration/http_test_client.cc)
target_link_libraries(pdserve_http_test_client PUBLIC absl::status
  absl::statusor absl::strings absl::time)
pdserve_add_cluster_tests(NAMES service_http service_http_connections
  service_http_logprobs service_chat service_drain LIBS pdserve_http_test_client)
# @grpc/grpc-js driving the gRPC API (tests/grpc_js/*.mjs; npm ci).
pdserve_add_cluster_tests(NAMES service_grpc_js)
# 1,000 concurrent streams: alone, so that no other test's cluster starves it.
pdserve_add_cluster_tests(NAMES service_openai_sdk LIBS pdserve_http_test_client
  SERIAL)
