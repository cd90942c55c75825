# Router behaviour with real processes (issue 5): migration of a stream when
# its decode worker dies (also meeting a client cancel or a deadline), and
# the measured --mode=auto policy. Uses the cluster harness of service.cmake.
pdserve_add_cluster_tests(NAMES service_migration service_migration_cancel
  service_auto_mode)
