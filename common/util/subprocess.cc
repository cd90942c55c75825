#include "common/util/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pdserve {

Subprocess::~Subprocess() {
  if (running()) {
    Signal(SIGKILL);
    (void)Wait(absl::InfiniteDuration());
  }
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      exit_status_(std::exchange(other.exit_status_, std::nullopt)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (running()) {
      Signal(SIGKILL);
      (void)Wait(absl::InfiniteDuration());
    }
    pid_ = std::exchange(other.pid_, -1);
    exit_status_ = std::exchange(other.exit_status_, std::nullopt);
  }
  return *this;
}

absl::StatusOr<Subprocess> Subprocess::Start(
    const std::vector<std::string>& argv, const SubprocessOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  // Everything the child needs is prepared before fork (no allocation after).
  std::vector<char*> cargv;
  cargv.reserve(argv.size() + 1);
  for (const std::string& a : argv)
    cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: die with the parent thread, even when it is SIGKILLed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent already died
    // Default signal dispositions and an empty mask for the new program.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (!options.stdout_path.empty()) {
      int fd = open(options.stdout_path.c_str(),
                    O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) dup2(fd, STDOUT_FILENO);
    }
    if (!options.stderr_path.empty()) {
      int fd = open(options.stderr_path.c_str(),
                    O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) dup2(fd, STDERR_FILENO);
    }
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  return Subprocess(pid);
}

void Subprocess::Signal(int signo) const {
  if (pid_ > 0 && !exit_status_.has_value()) kill(pid_, signo);
}

std::optional<int> Subprocess::Poll() {
  if (pid_ <= 0) return std::nullopt;
  if (exit_status_.has_value()) return exit_status_;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_status_ = status;
  return exit_status_;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no child");
  if (exit_status_.has_value()) return *exit_status_;
  if (timeout == absl::InfiniteDuration()) {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0) {
      if (errno != EINTR) {
        return absl::InternalError(
            absl::StrCat("waitpid: ", std::strerror(errno)));
      }
    }
    exit_status_ = status;
    return status;
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (auto s = Poll(); s.has_value()) return *s;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

int Subprocess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return -1;
  if (!running()) return *exit_status_;
  Signal(SIGTERM);
  auto s = Wait(grace);
  if (s.ok()) return *s;
  Signal(SIGKILL);
  return *Wait(absl::InfiniteDuration());
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status))
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("wait status ", status);
}

absl::StatusOr<std::string> MakeTempDirectory(const std::string& prefix) {
  const char* env = std::getenv("TMPDIR");
  const std::string base = env != nullptr && *env != '\0' ? env : "/tmp";
  std::string path = absl::StrCat(base, "/", prefix, "XXXXXX");
  if (mkdtemp(path.data()) == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a folder in ", base,
                     env != nullptr && *env != '\0' ? " ($TMPDIR)" : "", ": ",
                     strerror(errno), "; set TMPDIR to a writable folder"));
  }
  return path;
}

std::string SelfExecutablePath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, n);
}

}  // namespace pdserve
