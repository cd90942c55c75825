# pdserve_metrics unit tests (gRPC builds only: the library links prometheus-cpp).
if(TARGET pdserve_metrics)
  pdserve_add_test(metrics_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/metrics_test.cc
    LIBS pdserve_metrics absl::strings)
  # Every metric name used by the dashboard and the Prometheus rules exists.
  pdserve_add_test(metrics_names_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/metrics_names_test.cc
    LIBS pdserve_metrics absl::strings nlohmann_json::nlohmann_json
    LABELS observability)
endif()
