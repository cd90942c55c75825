// Minimal leveled logging to stderr with a timestamp and the process role.
// Thread-safe: each line is written with one fwrite call under a mutex.
#ifndef PDSERVE_COMMON_UTIL_LOGGING_H_
#define PDSERVE_COMMON_UTIL_LOGGING_H_

#include <string>
#include <string_view>

#include "absl/strings/str_format.h"

namespace pdserve {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Sets the role tag printed on every line ("router", "prefill", ...), and the
// minimum level printed (default kInfo;
// PDSERVE_LOG_LEVEL=debug|info|warning|error).
void SetLogRole(std::string_view role);
void SetMinLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& message);

template <typename... Args>
void Log(LogLevel level, const absl::FormatSpec<Args...>& format,
         const Args&... args) {
  if (LogEnabled(level)) LogLine(level, absl::StrFormat(format, args...));
}

}  // namespace pdserve

#define PDSERVE_LOG_INFO(...) \
  ::pdserve::Log(::pdserve::LogLevel::kInfo, __VA_ARGS__)
#define PDSERVE_LOG_WARNING(...) \
  ::pdserve::Log(::pdserve::LogLevel::kWarning, __VA_ARGS__)
#define PDSERVE_LOG_ERROR(...) \
  ::pdserve::Log(::pdserve::LogLevel::kError, __VA_ARGS__)
#define PDSERVE_LOG_DEBUG(...) \
  ::pdserve::Log(::pdserve::LogLevel::kDebug, __VA_ARGS__)

#endif  // PDSERVE_COMMON_UTIL_LOGGING_H_
