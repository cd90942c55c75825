// Abseil's lock-order (deadlock) detection, which Debian's libabsl builds in
// and turns on by default: every Mutex lock then takes one process-wide spin
// lock to update a lock graph: 14x the cost of an uncontended lock with two
// threads (tools/bench/mutex_bench.cc; docs/performance.md, "Abseil's
// lock-order checking").
// Free function; call once at process start, before threads.
#ifndef PDSERVE_COMMON_UTIL_MUTEX_DEBUGGING_H_
#define PDSERVE_COMMON_UTIL_MUTEX_DEBUGGING_H_

#include <string>

namespace pdserve {

// Sets the detection mode from PDSERVE_MUTEX_DEADLOCK_DETECTION: "off" (also
// when unset or empty), "report" (log a lock-order cycle to stderr) or
// "abort" (log it, then abort). Returns an error message for any other value
// (detection is then off), or "" when the value was understood.
std::string ConfigureMutexDeadlockDetection();

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_MUTEX_DEBUGGING_H_
