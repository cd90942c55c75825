// Registry of `pdserve` subcommands. Each subcommand lives in its own file
// under tools/engine_cmds/ (no gRPC) or tools/service_cmds/ (gRPC) and
// registers itself with a static PDSERVE_SUBCOMMAND(...) object.
// Registration happens before main(); lookups afterwards are read-only.
#ifndef PDSERVE_TOOLS_SUBCOMMAND_H_
#define PDSERVE_TOOLS_SUBCOMMAND_H_

#include <functional>
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
  SubcommandFn run;
};

std::map<std::string, Subcommand>& SubcommandRegistry();

struct SubcommandRegistration {
  SubcommandRegistration(std::string name, std::string summary,
                         std::string usage, SubcommandFn run);
};

}  // namespace pdserve

#define PDSERVE_SUBCOMMAND_CONCAT_INNER_(a, b) a##b
#define PDSERVE_SUBCOMMAND_CONCAT_(a, b) PDSERVE_SUBCOMMAND_CONCAT_INNER_(a, b)
// PDSERVE_SUBCOMMAND("complete", "one-line summary", "usage text", RunFn);
#define PDSERVE_SUBCOMMAND(name, summary, usage, fn)                   \
  static ::pdserve::SubcommandRegistration PDSERVE_SUBCOMMAND_CONCAT_( \
      pdserve_subcommand_, __LINE__)(name, summary, usage, fn)

#endif  // PDSERVE_TOOLS_SUBCOMMAND_H_
