# Chaos soak (tests/integration/soak_test.cc): `up` with 1 prefill + 2 decode
# workers under load while random workers are SIGKILLed. The suite runs the
# short form; PDSERVE_SOAK_REQUESTS etc. select the long form (docs/service.md).
pdserve_add_cluster_tests(NAMES soak SERIAL)
