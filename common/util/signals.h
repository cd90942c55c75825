// Termination signals for long-running roles: block SIGINT/SIGTERM in every
// thread (call first in main, before any thread starts) and wait for them
// synchronously with sigtimedwait. Thread-safe (process-wide signal mask).
#ifndef PDSERVE_COMMON_UTIL_SIGNALS_H_
#define PDSERVE_COMMON_UTIL_SIGNALS_H_

#include <optional>

#include "absl/time/time.h"

namespace pdserve {

void BlockTerminationSignals();
// The signal received (SIGINT, SIGTERM), or nullopt after `timeout`.
std::optional<int> WaitForTerminationSignal(absl::Duration timeout);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_SIGNALS_H_
