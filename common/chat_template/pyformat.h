// Python's text formatting as templates reach it: json.dumps (transformers'
// `tojson` filter), `str % args` (and the `format` filter), str.format() and
// format(value, spec). Output matches CPython byte for byte for the supported
// conversions; errors carry CPython's message. Every function refuses to build
// a string longer than `max_bytes`. Pure functions, thread-safe.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_PYFORMAT_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_PYFORMAT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chat_template/value.h"

namespace pdserve::jinja {

// json.dumps' formatting arguments (a value type).
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// json.dumps(v, ...). TypeError messages as Python's for values JSON cannot
// hold ("Object of type Undefined is not JSON serializable").
absl::Status JsonDump(const Value& v, const JsonDumpOptions& options,
                      size_t max_bytes, std::string* out);

// fmt % args (args: a tuple, a mapping, or one value).
absl::StatusOr<std::string> PercentFormat(std::string_view fmt,
                                          const Value& args, size_t max_bytes);

// fmt.format(*args, **kwargs).
absl::StatusOr<std::string> StrFormat(
    std::string_view fmt, const std::vector<Value>& args,
    const std::vector<std::pair<std::string, Value>>& kwargs, size_t max_bytes);

// format(v, spec).
absl::StatusOr<std::string> FormatValue(const Value& v, std::string_view spec,
                                        size_t max_bytes);

// Digits of |f| as printf's %e/%f/%g (type) print them, and of an integer in
// base 10/16/8/2 (type d, x/X, o, b); no sign. Shared by the formatters.
std::string FloatDigits(double f, char type, int precision, bool alt);
std::string IntDigits(int64_t v, char type);
// Inserts `sep` every `every` digits from the right.
std::string Group(const std::string& digits, char sep, int every);

// "too large" error shared by the engine's size checks.
absl::Status TooLarge(size_t bytes, size_t max_bytes);

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_PYFORMAT_H_
