// `pdserve`: one binary, every role and tool as a subcommand.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tools/subcommand.h"

namespace pdserve {

std::map<std::string, Subcommand>& SubcommandRegistry() {
  static auto* registry = new std::map<std::string, Subcommand>();
  return *registry;
}

SubcommandRegistration::SubcommandRegistration(std::string name,
                                               std::string summary,
                                               std::string usage,
                                               SubcommandFn run) {
  std::string key = name;
  SubcommandRegistry()[key] = Subcommand{std::move(name), std::move(summary),
                                         std::move(usage), std::move(run)};
}

namespace {

void PrintHelp() {
  std::printf(
      "pdserve: disaggregated prefill/decode LLM serving\n\n"
      "usage: pdserve <subcommand> [--flags] [args]\n\nsubcommands:\n");
  for (const auto& [name, cmd] : SubcommandRegistry()) {
    std::printf("  %-16s %s\n", name.c_str(), cmd.summary.c_str());
  }
  std::printf(
      "\n`pdserve <subcommand> --help` lists that subcommand's usage and "
      "flags.\n");
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  using pdserve::SubcommandRegistry;
  if (argc < 2 || std::string(argv[1]) == "help" ||
      std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    pdserve::PrintHelp();
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  auto it = SubcommandRegistry().find(name);
  if (it == SubcommandRegistry().end()) {
    std::fprintf(stderr, "pdserve: unknown subcommand '%s'\n\n", name.c_str());
    pdserve::PrintHelp();
    return 2;
  }
  absl::SetProgramUsageMessage(
      absl::StrCat(it->second.summary, "\n\nusage: ", it->second.usage));
  // Flags are shared by every subcommand of the binary; `--help` lists those
  // defined under tools/ (helpshort shows the main file's only).
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "tools/");
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::string program = std::string("pdserve ") + name;
  std::vector<char*> args;
  args.push_back(program.data());
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  std::vector<std::string> rest(positional.begin(), positional.end());
  return it->second.run(rest);
}
