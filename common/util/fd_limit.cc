#include "common/util/fd_limit.h"

#include <sys/resource.h>

#include <limits>

namespace pdserve {
namespace {

int64_t AsInt64(rlim_t v) {
  if (v == RLIM_INFINITY ||
      v > static_cast<rlim_t>(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return static_cast<int64_t>(v);
}

}  // namespace

int64_t OpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  return AsInt64(limit.rlim_cur);
}

int64_t RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  // An unlimited hard limit still stops at the kernel's fs.nr_open
  // (1048576 by default); ask for that.
  const rlim_t target = limit.rlim_max == RLIM_INFINITY
                            ? static_cast<rlim_t>(1) << 20
                            : limit.rlim_max;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < target) {
    rlimit raised = limit;
    raised.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return AsInt64(limit.rlim_cur);
}

}  // namespace pdserve
