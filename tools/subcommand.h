// Registry of `pdserve` subcommands. Each subcommand lives in its own file
// under tools/engine_cmds/ (no gRPC) or tools/service_cmds/ (gRPC) and
// registers itself with a static PDSERVE_SUBCOMMAND(...) object, naming the
// flags it takes: the flags defined in its own file, plus those listed
// (shared flags, by name). main() accepts only those (an unknown or another
// subcommand's flag is an error naming the subcommand) and `--help` lists
// only those. Registration happens before main(); lookups afterwards are
// read-only.
#ifndef PDSERVE_TOOLS_SUBCOMMAND_H_
#define PDSERVE_TOOLS_SUBCOMMAND_H_

#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace pdserve {

// A subcommand receives the positional arguments left after Abseil flag
// parsing (argv[0] is "pdserve <name>") and returns the process exit code.
using SubcommandFn = std::function<int(const std::vector<std::string>& args)>;

struct Subcommand {
  std::string name;
  std::string summary;  // one line, shown by `pdserve help`
  std::string usage;    // shown by `pdserve <name> --help`
  // Shared flags it takes (names without dashes), besides every flag defined
  // in `file`, the file that registered it.
  std::vector<std::string> shared_flags;
  std::string file;
  SubcommandFn run;
};

std::map<std::string, Subcommand>& SubcommandRegistry();

// Every flag `subcommand` takes (sorted names): its own file's flags and its
// shared flags. Empty for an unknown subcommand.
std::vector<std::string> FlagsOfSubcommand(const std::string& subcommand);

// A list of flag names made of several (the groups of tools/common_flags.h
// and tools/service_cmds/service_common.h, and a subcommand's own names).
std::vector<std::string> FlagNames(
    std::initializer_list<std::vector<std::string>> lists);

struct SubcommandRegistration {
  SubcommandRegistration(std::string name, std::string summary,
                         std::string usage,
                         std::vector<std::string> shared_flags,
                         std::string file, SubcommandFn run);
};

}  // namespace pdserve

#define PDSERVE_SUBCOMMAND_CONCAT_INNER_(a, b) a##b
#define PDSERVE_SUBCOMMAND_CONCAT_(a, b) PDSERVE_SUBCOMMAND_CONCAT_INNER_(a, b)
// PDSERVE_SUBCOMMAND("complete", "one-line summary", "usage text",
//                    FlagNames({EngineFlagNames(), {"json"}}), RunFn);
#define PDSERVE_SUBCOMMAND(name, summary, usage, shared_flags, fn)       \
  static ::pdserve::SubcommandRegistration PDSERVE_SUBCOMMAND_CONCAT_(   \
      pdserve_subcommand_, __LINE__)(name, summary, usage, shared_flags, \
                                     __FILE__, fn)

#endif  // PDSERVE_TOOLS_SUBCOMMAND_H_
