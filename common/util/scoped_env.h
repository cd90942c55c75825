// ScopedEnv: sets (or, with an empty value, unsets) one environment variable
// for as long as it lives, then restores what was there; children started
// meanwhile inherit it (e.g. UCX_TLS for a worker process). Not thread-safe:
// the environment is the process's, so use it where nothing else changes it.
#ifndef PDSERVE_COMMON_UTIL_SCOPED_ENV_H_
#define PDSERVE_COMMON_UTIL_SCOPED_ENV_H_

#include <cstdlib>
#include <string>
#include <utility>

namespace pdserve {

class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value)
      : name_(std::move(name)) {
    if (const char* old = getenv(name_.c_str())) {
      had_ = true;
      old_ = old;
    }
    if (value.empty()) {
      unsetenv(name_.c_str());
    } else {
      setenv(name_.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const std::string name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_SCOPED_ENV_H_
