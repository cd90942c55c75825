#include "common/util/mutex_debugging.h"

#include <cstdlib>

#include "absl/synchronization/mutex.h"

namespace pdserve {

std::string ConfigureMutexDeadlockDetection() {
  const char* env = std::getenv("PDSERVE_MUTEX_DEADLOCK_DETECTION");
  const std::string value = env == nullptr ? "" : env;
  absl::OnDeadlockCycle mode = absl::OnDeadlockCycle::kIgnore;
  std::string error;
  if (value == "report") {
    mode = absl::OnDeadlockCycle::kReport;
  } else if (value == "abort") {
    mode = absl::OnDeadlockCycle::kAbort;
  } else if (!value.empty() && value != "off") {
    error = "PDSERVE_MUTEX_DEADLOCK_DETECTION=" + value +
            " is not one of off, report, abort; detection stays off";
  }
  absl::SetMutexDeadlockDetectionMode(mode);
  return error;
}

}  // namespace pdserve
