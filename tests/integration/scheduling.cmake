# Scheduling and KV memory at scale (issue 5): prefix-aware routing and the
# prefill worker's prefix cache; admission control; chunked prefill. Uses the
# cluster harness of service.cmake.
pdserve_add_cluster_tests(NAMES service_prefix service_admission
  service_chunked)
