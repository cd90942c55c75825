#include "common/util/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pdserve {
namespace {

absl::Mutex log_mutex;
std::string* RoleTag() {
  static std::string* tag = new std::string("pdserve");
  return tag;
}

LogLevel LevelFromEnv() {
  const char* env = std::getenv("PDSERVE_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  std::string value(env);
  if (value == "debug") return LogLevel::kDebug;
  if (value == "warning") return LogLevel::kWarning;
  if (value == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int> min_level{static_cast<int>(LevelFromEnv())};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarning:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}

}  // namespace

void SetLogRole(std::string_view role) {
  absl::MutexLock lock(&log_mutex);
  *RoleTag() = std::string(role);
}

void SetMinLogLevel(LogLevel level) { min_level = static_cast<int>(level); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= min_level; }

void LogLine(LogLevel level, const std::string& message) {
  std::string line;
  {
    absl::MutexLock lock(&log_mutex);
    line = absl::StrFormat(
        "%s %s [%s] %s\n", LevelName(level),
        absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone()),
        *RoleTag(), message);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
}

}  // namespace pdserve
