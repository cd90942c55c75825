// `pdserve`: one binary, every role and tool as a subcommand. Abseil flags
// parse the command line, but each subcommand takes only its own flags
// (tools/subcommand.h): main() checks them and prints their help.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/util/fd_limit.h"
#include "common/util/mutex_debugging.h"
#include "tools/subcommand.h"

namespace pdserve {

std::map<std::string, Subcommand>& SubcommandRegistry() {
  static auto* registry = new std::map<std::string, Subcommand>();
  return *registry;
}

SubcommandRegistration::SubcommandRegistration(
    std::string name, std::string summary, std::string usage,
    std::vector<std::string> shared_flags, std::string file, SubcommandFn run) {
  std::string key = name;
  SubcommandRegistry()[key] =
      Subcommand{std::move(name),         std::move(summary), std::move(usage),
                 std::move(shared_flags), std::move(file),    std::move(run)};
}

std::vector<std::string> FlagNames(
    std::initializer_list<std::vector<std::string>> lists) {
  std::vector<std::string> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

std::vector<std::string> FlagsOfSubcommand(const std::string& subcommand) {
  auto it = SubcommandRegistry().find(subcommand);
  if (it == SubcommandRegistry().end()) return {};
  std::set<std::string> names(it->second.shared_flags.begin(),
                              it->second.shared_flags.end());
  // Abseil reports a flag's file with its leading '/' removed.
  absl::string_view file = it->second.file;
  while (absl::ConsumePrefix(&file, "/")) {
  }
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    const std::string flag_filename = flag->Filename();
    absl::string_view flag_file = flag_filename;
    while (absl::ConsumePrefix(&flag_file, "/")) {
    }
    if (flag_file == file) names.insert(std::string(name));
  }
  return {names.begin(), names.end()};
}

namespace {

// Abseil's own flags that every subcommand accepts.
const std::set<std::string>& BuiltinFlags() {
  static const auto* builtin =
      new std::set<std::string>{"flagfile", "fromenv", "tryfromenv", "undefok"};
  return *builtin;
}

bool IsHelpArg(const std::string& arg) {
  return arg == "--help" || arg == "-help" || arg == "-h" ||
         arg == "--helpfull" || arg == "--helpshort";
}

void PrintHelp() {
  std::printf(
      "pdserve: disaggregated prefill/decode LLM serving\n\n"
      "usage: pdserve <subcommand> [--flags] [args]\n\nsubcommands:\n");
  for (const auto& [name, cmd] : SubcommandRegistry()) {
    std::printf("  %-18s %s\n", name.c_str(), cmd.summary.c_str());
  }
  std::printf(
      "\n`pdserve <subcommand> --help` lists that subcommand's usage and "
      "flags.\n");
}

// `pdserve NAME --help`: the usage and each flag NAME takes, with its
// default.
void PrintSubcommandHelp(const Subcommand& cmd) {
  std::printf("pdserve %s: %s\n\nusage: %s\n", cmd.name.c_str(),
              cmd.summary.c_str(), cmd.usage.c_str());
  const std::vector<std::string> names = FlagsOfSubcommand(cmd.name);
  if (names.empty()) {
    std::printf("\n`pdserve %s` takes no flags.\n", cmd.name.c_str());
    return;
  }
  std::printf("\nflags:\n");
  for (const std::string& name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;  // reported by CheckRegistrations
    std::string def = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) def = absl::StrCat("\"", def, "\"");
    std::printf("  --%s (default %s)\n      %s\n", name.c_str(), def.c_str(),
                flag->Help().c_str());
  }
  std::printf("\nAlso: --flagfile=FILE reads flags from FILE, one per line.\n");
}

// The subcommands that take flag NAME.
std::vector<std::string> OwnersOf(const std::string& name) {
  std::vector<std::string> owners;
  for (const auto& [sub, cmd] : SubcommandRegistry()) {
    const auto flags = FlagsOfSubcommand(sub);
    if (std::binary_search(flags.begin(), flags.end(), name))
      owners.push_back(sub);
  }
  return owners;
}

// Why flag NAME is refused by `pdserve SUB`, with what to do next.
std::string RefusalOf(const std::string& sub, const std::string& name) {
  const std::vector<std::string> owners = OwnersOf(name);
  if (owners.empty()) {
    return absl::StrCat("pdserve ", sub, ": unknown flag --", name,
                        ". `pdserve ", sub, " --help` lists its flags.");
  }
  return absl::StrCat(
      "pdserve ", sub, ": --", name, " is not a flag of `pdserve ", sub,
      "` (it is one of `pdserve ", absl::StrJoin(owners, "`, `pdserve "),
      "`). `pdserve ", sub, " --help` lists its flags.");
}

// The flag names on the command line (before "--"), resolved as Abseil
// does: "--name=v", "--name v" (non-bool), "--noname" (bool), one or two
// dashes. Unknown names are returned as written.
std::vector<std::string> FlagNamesInArgs(const std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    absl::ConsumePrefix(&arg, "-");
    absl::ConsumePrefix(&arg, "-");
    const size_t eq = arg.find('=');
    std::string name(arg.substr(0, eq));
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      const absl::CommandLineFlag* negated =
          absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        name = name.substr(2);
      }
    }
    // "--name value": the next argument is the value, not a flag.
    if (flag != nullptr && eq == absl::string_view::npos &&
        !flag->IsOfType<bool>()) {
      ++i;
    }
    names.push_back(name);
  }
  return names;
}

// Every registration names flags that exist, and every flag defined under
// tools/ is taken by some subcommand (`pdserve help --check_flags`; a test).
int CheckRegistrations() {
  int problems = 0;
  std::set<std::string> taken;
  for (const auto& [sub, cmd] : SubcommandRegistry()) {
    for (const std::string& name : cmd.shared_flags) {
      if (absl::FindCommandLineFlag(name) == nullptr) {
        std::fprintf(stderr, "%s lists --%s, which no file defines\n",
                     sub.c_str(), name.c_str());
        ++problems;
      }
    }
    for (const std::string& name : FlagsOfSubcommand(sub)) taken.insert(name);
  }
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::StrContains(flag->Filename(), "tools/")) continue;
    if (!taken.count(std::string(name))) {
      std::fprintf(stderr, "--%s (%s) is taken by no subcommand\n",
                   std::string(name).c_str(), flag->Filename().c_str());
      ++problems;
    }
  }
  std::printf("%zu subcommands, %zu flags: %d problems\n",
              SubcommandRegistry().size(), taken.size(), problems);
  return problems == 0 ? 0 : 1;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  using pdserve::SubcommandRegistry;
  // Before any thread: lock-order tracking off unless asked for (it
  // serialises every lock in the process on one spin lock).
  const std::string mutex_mode_error =
      pdserve::ConfigureMutexDeadlockDetection();
  if (!mutex_mode_error.empty()) {
    std::fprintf(stderr, "pdserve: %s\n", mutex_mode_error.c_str());
  }
  if (argc < 2 || std::string(argv[1]) == "help" ||
      std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    if (argc == 3 && std::string(argv[2]) == "--check_flags") {
      return pdserve::CheckRegistrations();
    }
    if (argc >= 3 && SubcommandRegistry().count(argv[2])) {
      pdserve::PrintSubcommandHelp(SubcommandRegistry().at(argv[2]));
      return 0;
    }
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
  const pdserve::Subcommand& cmd = it->second;
  std::vector<std::string> raw(argv + 2, argv + argc);
  for (const std::string& a : raw) {
    if (a == "--") break;
    if (pdserve::IsHelpArg(a)) {
      pdserve::PrintSubcommandHelp(cmd);
      return 0;
    }
  }
  const std::vector<std::string> takes = pdserve::FlagsOfSubcommand(name);
  auto refused = [&](const std::string& flag) {
    return !std::binary_search(takes.begin(), takes.end(), flag) &&
           !pdserve::BuiltinFlags().count(flag);
  };
  for (const std::string& flag : pdserve::FlagNamesInArgs(raw)) {
    if (refused(flag)) {
      std::fprintf(stderr, "%s\n", pdserve::RefusalOf(name, flag).c_str());
      return 2;
    }
  }
  absl::SetProgramUsageMessage(
      absl::StrCat(cmd.summary, "\n\nusage: ", cmd.usage));
  std::string program = std::string("pdserve ") + name;
  std::vector<char*> args;
  args.push_back(program.data());
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  // Flags that came from a --flagfile or the environment.
  for (const auto& [flag_name, flag] : absl::GetAllFlags()) {
    const std::string flag_str(flag_name);
    if (absl::flags_internal::WasPresentOnCommandLine(flag_name) &&
        refused(flag_str)) {
      std::fprintf(stderr, "%s\n", pdserve::RefusalOf(name, flag_str).c_str());
      return 2;
    }
  }
  std::vector<std::string> rest(positional.begin(), positional.end());
  // Connections, channels and endpoints each take a descriptor: the hard
  // limit is what the operator set, the soft one is often a 1024 default.
  pdserve::RaiseOpenFileLimit();
  return cmd.run(rest);
}
