#include "common/util/signals.h"

#include <signal.h>

#include <cerrno>
#include <ctime>

namespace pdserve {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  // A process started in the background of a non-interactive shell inherits
  // SIGINT as ignored, and an ignored signal is discarded even while blocked:
  // restore the default disposition so that sigtimedwait() receives it.
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

std::optional<int> WaitForTerminationSignal(absl::Duration timeout) {
  sigset_t set = TerminationSet();
  timespec ts = absl::ToTimespec(timeout);
  while (true) {
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno == EINTR) continue;
    return std::nullopt;
  }
}

}  // namespace pdserve
