# Deployment tests (issue 7): shell scripts under tests/deploy/.
#  deploy.k8s_manifests (label `deploy`, seconds): kustomize renders + offline
#    schema/consistency checks + flags known to the binary.
#  deploy.container (label `container`, minutes): podman image build, `pdserve
#    up` in a container, `podman play kube` of the manifests. RUN_SERIAL: it
#    compiles the project inside the image build and would slow the timing-
#    sensitive integration tests if it ran next to them.
add_test(NAME deploy.k8s_manifests
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/k8s_manifests_test.sh $<TARGET_FILE:pdserve>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(deploy.k8s_manifests PROPERTIES LABELS deploy TIMEOUT 300)

add_test(NAME deploy.container
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/container_test.sh $<TARGET_FILE:pdserve>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(deploy.container PROPERTIES LABELS container TIMEOUT 1800 RUN_SERIAL TRUE)
