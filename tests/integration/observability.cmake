# Observability checks (CTest label `observability`): promtool on the
# Prometheus config and rules, and the end-to-end Prometheus test against a
# local cluster. promtool/prometheus come from the Debian `prometheus`
# package (scripts/install_deps.sh); when missing the tests FAIL saying so.
if(NOT PDSERVE_BUILD_TESTS)
  return()
endif()
if(NOT DEFINED PDSERVE_OBS_SOURCE_DIR)
  set(PDSERVE_OBS_SOURCE_DIR ${CMAKE_SOURCE_DIR})
endif()
set(_obs_dir ${PDSERVE_OBS_SOURCE_DIR}/deploy/prometheus)
find_program(PDSERVE_PROMTOOL promtool)
find_package(Python3 COMPONENTS Interpreter)

if(PDSERVE_PROMTOOL)
  set(_promtool ${PDSERVE_PROMTOOL})
else()
  # Registered anyway so that a missing promtool is a visible failure.
  set(_promtool sh -c "echo 'promtool not found: apt-get install prometheus (scripts/install_deps.sh)' >&2; exit 1" promtool)
endif()

add_test(NAME observability.promtool_check_config
  COMMAND ${_promtool} check config ${_obs_dir}/prometheus.yml)
add_test(NAME observability.promtool_check_config_kubernetes
  COMMAND ${PDSERVE_OBS_SOURCE_DIR}/tests/observability/check_kubernetes_config.sh
          ${PDSERVE_OBS_SOURCE_DIR})
add_test(NAME observability.promtool_check_rules
  COMMAND ${_promtool} check rules ${_obs_dir}/rules/recording.yml
          ${_obs_dir}/rules/alerts.yml)
add_test(NAME observability.promtool_test_rules
  COMMAND ${_promtool} test rules ${_obs_dir}/tests/recording_test.yml
          ${_obs_dir}/tests/alerts_test.yml)
set(_obs_tests observability.promtool_check_config
    observability.promtool_check_config_kubernetes
    observability.promtool_check_rules observability.promtool_test_rules)

# Real Prometheus against `pdserve up` (needs the pdserve binary with the
# service subcommands). Exit 2 = prerequisite missing: reported as a failure.
if(TARGET pdserve AND Python3_Interpreter_FOUND)
  add_test(NAME observability.prometheus_e2e
    COMMAND ${Python3_EXECUTABLE}
            ${PDSERVE_OBS_SOURCE_DIR}/tests/observability/prometheus_e2e.py
            --pdserve $<TARGET_FILE:pdserve> --repo ${PDSERVE_OBS_SOURCE_DIR})
  set_tests_properties(observability.prometheus_e2e PROPERTIES TIMEOUT 300
    RESOURCE_LOCK pdserve_cluster)
  list(APPEND _obs_tests observability.prometheus_e2e)
else()
  add_test(NAME observability.prometheus_e2e
    COMMAND sh -c "echo 'prometheus_e2e needs python3 and the pdserve target' >&2; exit 1")
  list(APPEND _obs_tests observability.prometheus_e2e)
endif()
set_tests_properties(${_obs_tests} PROPERTIES LABELS observability
  WORKING_DIRECTORY ${PDSERVE_OBS_SOURCE_DIR})

# Every metric of every role against what a client saw, on a real cluster
# (cluster harness; free ports, so no lock is needed).
# pdserve_cluster_harness is defined by service.cmake (same condition).
if(TARGET pdserve_client AND TARGET pdserve_metrics)
  pdserve_add_test(observability_metrics_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/observability_metrics_test.cc
    LIBS pdserve_cluster_harness pdserve_metrics pdserve_router
         nlohmann_json::nlohmann_json
    LABELS "integration;observability")
endif()
