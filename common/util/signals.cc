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
