// Child processes: fork/exec with PR_SET_PDEATHSIG(SIGKILL) so a child never
// outlives the thread that started it (no orphans even if the parent is
// killed with SIGKILL). Used by `pdserve up` and the integration tests.
// A Subprocess object is not thread-safe; the destructor kills (SIGKILL) and
// reaps a child that is still running.
#ifndef PDSERVE_COMMON_UTIL_SUBPROCESS_H_
#define PDSERVE_COMMON_UTIL_SUBPROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve {

struct SubprocessOptions {
  // Redirect the child's stdout/stderr to these files (appending); empty =
  // inherit the parent's.
  std::string stdout_path;
  std::string stderr_path;
};

class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;

  // argv[0] is the program path (execv, no PATH search).
  static absl::StatusOr<Subprocess> Start(
      const std::vector<std::string>& argv,
      const SubprocessOptions& options = {});

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exit_status_.has_value(); }

  // Sends a signal (no-op when already reaped).
  void Signal(int signo) const;
  // Non-blocking: reaps the child if it exited. Returns its raw wait status.
  std::optional<int> Poll();
  // Waits up to `timeout` (InfiniteDuration = forever); DEADLINE_EXCEEDED
  // when still running afterwards.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGTERM, wait up to `grace`, then SIGKILL and reap.
  int Stop(absl::Duration grace);

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
};

// "exited with code N" / "killed by signal SIGKILL" for a raw wait status.
std::string DescribeWaitStatus(int status);

// Path of the running executable (/proc/self/exe resolved).
std::string SelfExecutablePath();

// Creates a fresh folder "$TMPDIR/<prefix>XXXXXX" (/tmp when TMPDIR is unset
// or empty) for the logs and files of child processes; the error names the
// folder and what to do.
absl::StatusOr<std::string> MakeTempDirectory(const std::string& prefix);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_SUBPROCESS_H_
