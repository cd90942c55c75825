# cli.flags_per_subcommand (label `cli`, seconds): each subcommand takes only
# its own flags; --help lists them; foreign and unknown flags are refused with
# the subcommand's name (tests/cli/flags_test.sh).
add_test(NAME cli.flags_per_subcommand
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/flags_test.sh $<TARGET_FILE:pdserve>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(cli.flags_per_subcommand PROPERTIES LABELS cli TIMEOUT 120)
