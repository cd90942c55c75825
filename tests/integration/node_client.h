// Node.js clients in the integration tests (the official OpenAI SDK, and
// @grpc/grpc-js): installing their pinned npm packages and running a script.
// Thread-safe (installs are serialized by a file lock).
#ifndef PDSERVE_TESTS_INTEGRATION_NODE_CLIENT_H_
#define PDSERVE_TESTS_INTEGRATION_NODE_CLIENT_H_

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pdserve::testing {

// Installs DIR/node_modules (npm ci, pinned by DIR/package-lock.json)
// once. The check and the install both run under a lock, and a marker is
// written only after npm ci succeeded: a parallel test never sees a
// half-installed tree, and never has one deleted under it by a second npm ci.
inline absl::Status InstallNpmPackages(const std::string& dir) {
  const int rc =
      std::system(absl::StrCat("cd ", dir,
                               " && flock package.json sh -c '"
                               "test -f node_modules/.pdserve-installed || "
                               "(npm ci --no-audit --no-fund --loglevel=error "
                               ">/dev/null 2>&1 && "
                               "touch node_modules/.pdserve-installed)'")
                      .c_str());
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("npm ci in ", dir,
                     " failed (needs the npm registry; "
                     "scripts/install_deps.sh installs node and npm)"));
  }
  return absl::OkStatus();
}

// Runs `node SCRIPT ARGS...` (SCRIPT under tests/openai/ unless it names a
// folder), appends its stdout and stderr to `output` (callers print it: it
// is the test's report) and returns its exit code.
inline int RunNode(const std::string& script,
                   const std::vector<std::string>& args, std::string* output) {
  std::string cmd = absl::StrCat(
      "node ", absl::StrContains(script, "/") ? "" : "tests/openai/", script);
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  absl::StrAppend(&cmd, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace pdserve::testing

#endif  // PDSERVE_TESTS_INTEGRATION_NODE_CLIENT_H_
