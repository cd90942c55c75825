# Same-host shared-memory KV transport (issue 5): shm chosen automatically on
# one host, outputs identical to the gRPC transport and the reference, no
# leaked segments. Uses the cluster harness of service.cmake.
pdserve_add_cluster_tests(NAMES service_shm LIBS pdserve_transport)
