// Argument binding and Python's int()/float() string parsing, shared by the
// filters, tests, methods and globals.
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/text.h"

namespace pdserve::jinja {

absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(
    std::string_view fn, const CallArgs& args,
    std::initializer_list<std::string_view> params) {
  std::vector<std::optional<Value>> out(params.size());
  if (args.args.size() > params.size()) {
    return RenderError(absl::StrCat(SV(fn), "() takes at most ", params.size(),
                                    " argument(s) (", args.args.size(),
                                    " given)"));
  }
  for (size_t i = 0; i < args.args.size(); ++i) out[i] = args.args[i];
  for (const auto& [key, value] : args.kwargs) {
    size_t index = 0;
    bool found = false;
    for (std::string_view p : params) {
      if (p == key) {
        found = true;
        break;
      }
      ++index;
    }
    if (!found) {
      return RenderError(absl::StrCat(
          SV(fn), "() got an unexpected keyword argument '", key, "'"));
    }
    if (out[index]) {
      return RenderError(absl::StrCat(
          SV(fn), "() got multiple values for argument '", key, "'"));
    }
    out[index] = value;
  }
  return out;
}

std::optional<int64_t> ParsePyInt(std::string_view s, int base) {
  s = PyStrip(s, nullptr, true, true);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  auto has_prefix = [&s](char c) {
    return s.size() >= 2 && s[0] == '0' && (s[1] | 0x20) == c;
  };
  if (base == 0) {
    base = has_prefix('x')   ? 16
           : has_prefix('o') ? 8
           : has_prefix('b') ? 2
                             : 10;
    if (base != 10) {
      s.remove_prefix(2);
    } else if (s.size() > 1 && s[0] == '0') {
      for (char c : s) {
        if (c != '0' && c != '_') return std::nullopt;  // "010" is invalid
      }
    }
  } else if ((base == 16 && has_prefix('x')) ||
             (base == 8 && has_prefix('o')) || (base == 2 && has_prefix('b'))) {
    s.remove_prefix(2);
    if (!s.empty() && s[0] == '_') s.remove_prefix(1);
  }
  if (base < 2 || base > 36 || s.empty()) return std::nullopt;
  uint64_t value = 0;
  bool last_underscore = true;  // no leading underscore
  for (char c : s) {
    if (c == '_') {
      if (last_underscore) return std::nullopt;
      last_underscore = true;
      continue;
    }
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
      d = (c | 0x20) - 'a' + 10;
    } else {
      return std::nullopt;
    }
    if (d >= base) return std::nullopt;
    if (value > (static_cast<uint64_t>(INT64_MAX) + 1 - d) / base) {
      return std::nullopt;
    }
    value = value * base + d;
    last_underscore = false;
  }
  if (last_underscore) return std::nullopt;
  if (!negative && value > static_cast<uint64_t>(INT64_MAX))
    return std::nullopt;
  return negative ? static_cast<int64_t>(0 - value)
                  : static_cast<int64_t>(value);
}

std::optional<double> ParsePyFloat(std::string_view s) {
  s = PyStrip(s, nullptr, true, true);
  std::string clean;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean.push_back(s[i++]);
  std::string rest;
  for (size_t k = i; k < s.size(); ++k) rest.push_back(s[k] | 0x20);
  if (rest == "inf" || rest == "infinity") {
    return clean == "-" ? -HUGE_VAL : HUGE_VAL;
  }
  if (rest == "nan") return std::nan("");
  bool digits = false, dot = false, exp = false;
  char prev = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') {
      digits = true;
    } else if (c == '_') {
      if (!(prev >= '0' && prev <= '9') || i + 1 >= s.size() ||
          !(s[i + 1] >= '0' && s[i + 1] <= '9')) {
        return std::nullopt;
      }
      prev = c;
      continue;
    } else if (c == '.' && !dot && !exp) {
      dot = true;
    } else if ((c == 'e' || c == 'E') && digits && !exp) {
      exp = true;
      clean.push_back(c);
      prev = c;
      if (i + 1 < s.size() && (s[i + 1] == '+' || s[i + 1] == '-')) {
        clean.push_back(s[++i]);
      }
      if (i + 1 >= s.size() || !(s[i + 1] >= '0' && s[i + 1] <= '9')) {
        return std::nullopt;
      }
      continue;
    } else {
      return std::nullopt;
    }
    clean.push_back(c);
    prev = c;
  }
  if (!digits) return std::nullopt;
  return std::strtod(clean.c_str(), nullptr);
}

std::vector<Value> StringChars(const std::string& s) {
  std::vector<Value> out;
  const std::vector<size_t> off = CharOffsets(s);
  out.reserve(off.size() - 1);
  for (size_t i = 0; i + 1 < off.size(); ++i) {
    out.push_back(Value::String(s.substr(off[i], off[i + 1] - off[i])));
  }
  return out;
}

}  // namespace pdserve::jinja
