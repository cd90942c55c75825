#include "common/chat_template/pyformat.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/chat_template/text.h"

namespace pdserve::jinja {
namespace {

absl::Status Error(std::string msg) {
  return absl::InvalidArgumentError(std::move(msg));
}

// ------------------------------------------------------------- % formatting

struct PercentSpec {
  bool left = false, zero = false, plus = false, space = false, alt = false;
  int width = 0;
  int precision = -1;
};

std::string Pad(std::string s, int width, bool left, size_t chars) {
  if (width <= 0 || chars >= static_cast<size_t>(width)) return s;
  const size_t pad = width - chars;
  return left ? s + std::string(pad, ' ') : std::string(pad, ' ') + s;
}

std::string PadNumber(const std::string& sign, const std::string& prefix,
                      const std::string& digits, const PercentSpec& sp) {
  const size_t len = sign.size() + prefix.size() + digits.size();
  if (sp.width <= 0 || len >= static_cast<size_t>(sp.width)) {
    return sign + prefix + digits;
  }
  const size_t pad = sp.width - len;
  if (sp.left) return sign + prefix + digits + std::string(pad, ' ');
  if (sp.zero) return sign + prefix + std::string(pad, '0') + digits;
  return std::string(pad, ' ') + sign + prefix + digits;
}

std::string SignOf(bool negative, const PercentSpec& sp) {
  if (negative) return "-";
  if (sp.plus) return "+";
  if (sp.space) return " ";
  return "";
}

absl::StatusOr<std::string> PercentOne(char type, const PercentSpec& sp,
                                       const Value& v) {
  switch (type) {
    case 's':
    case 'r':
    case 'a': {
      std::string s = type == 's' ? Str(v) : Repr(v);
      if (sp.precision >= 0) {
        const std::vector<size_t> off = CharOffsets(s);
        if (static_cast<size_t>(sp.precision) + 1 < off.size()) {
          s.resize(off[sp.precision]);
        }
      }
      const size_t chars = CharCount(s);
      return Pad(std::move(s), sp.width, sp.left, chars);
    }
    case 'c': {
      std::string s;
      if (v.is_integral()) {
        if (v.int_value() < 0 || v.int_value() > 0x10FFFF) {
          return Error("%c arg not in range(0x110000)");
        }
        AppendUtf8(static_cast<char32_t>(v.int_value()), &s);
      } else if (v.is_string() && CharCount(v.str()) == 1) {
        s = v.str();
      } else {
        return Error("%c requires int or char");
      }
      return Pad(s, sp.width, sp.left, 1);
    }
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o': {
      int64_t i;
      if (v.is_integral()) {
        i = v.int_value();
      } else if (v.is_float() && (type == 'd' || type == 'i' || type == 'u')) {
        const double f = v.float_value();
        if (!std::isfinite(f)) {
          return Error("cannot convert float infinity to integer");
        }
        if (std::fabs(f) >= 9.2e18) return Error("integer overflow");
        i = static_cast<int64_t>(f);
      } else if (type == 'd' || type == 'i' || type == 'u') {
        return Error(absl::StrCat("%", std::string(1, type),
                                  " format: a real number is required, not ",
                                  TypeName(v)));
      } else {
        return Error(absl::StrCat("%", std::string(1, type),
                                  " format: an integer is required, not ",
                                  TypeName(v)));
      }
      const char t = (type == 'i' || type == 'u') ? 'd' : type;
      std::string digits = IntDigits(i, t);
      if (sp.precision > 0 &&
          digits.size() < static_cast<size_t>(sp.precision)) {
        digits.insert(0, sp.precision - digits.size(), '0');
      }
      const char* prefix = "";
      if (sp.alt && t == 'x') prefix = "0x";
      if (sp.alt && t == 'X') prefix = "0X";
      if (sp.alt && t == 'o') prefix = "0o";
      return PadNumber(SignOf(i < 0, sp), prefix, digits, sp);
    }
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G': {
      if (!v.is_number()) {
        return Error(absl::StrCat("must be real number, not ", TypeName(v)));
      }
      const double f = v.AsDouble();
      const std::string digits =
          FloatDigits(f, type, sp.precision < 0 ? 6 : sp.precision, sp.alt);
      PercentSpec s2 = sp;
      if (!std::isfinite(f)) s2.zero = false;
      return PadNumber(SignOf(std::signbit(f) && !std::isnan(f), sp), "",
                       digits, s2);
    }
    default:
      return Error("unsupported format character");
  }
}

}  // namespace

// ------------------------------------------------------- number formatting

// Digits of |f| in printf style (no sign). type: e E f F g G.
std::string FloatDigits(double f, char type, int precision, bool alt) {
  f = std::fabs(f);
  if (std::isinf(f)) return std::isupper(type) ? "INF" : "inf";
  if (std::isnan(f)) return std::isupper(type) ? "NAN" : "nan";
  char fmt[16];
  std::snprintf(fmt, sizeof(fmt), "%%%s.*%c", alt ? "#" : "", type);
  const int n = std::snprintf(nullptr, 0, fmt, precision, f);
  std::string out(n, '\0');
  std::snprintf(out.data(), n + 1, fmt, precision, f);
  return out;
}

std::string IntDigits(int64_t v, char type) {
  uint64_t u = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  if (u == 0) return "0";
  int base = 10;
  if (type == 'x' || type == 'X') base = 16;
  if (type == 'o') base = 8;
  if (type == 'b') base = 2;
  const char* digits = type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string out;
  while (u > 0) {
    out.push_back(digits[u % base]);
    u /= base;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::string Group(const std::string& digits, char sep, int every) {
  std::string out;
  const int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % every == 0) out.push_back(sep);
    out.push_back(digits[i]);
  }
  return out;
}

absl::Status TooLarge(size_t bytes, size_t max_bytes) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template output too large: ", bytes,
                   " bytes exceeds the limit of ", max_bytes, " bytes"));
}

absl::StatusOr<std::string> PercentFormat(std::string_view fmt,
                                          const Value& args, size_t max_bytes) {
  std::vector<Value> positional;
  const DictData* mapping = nullptr;
  if (args.is_list() && args.seq_kind() == SeqKind::kTuple) {
    positional = args.list().items;
  } else if (args.is_dict()) {
    mapping = &args.dict();
    positional.push_back(args);
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  size_t i = 0;
  while (i < fmt.size()) {
    if (out.size() > max_bytes) return TooLarge(out.size(), max_bytes);
    const char c = fmt[i];
    if (c != '%') {
      out.push_back(c);
      ++i;
      continue;
    }
    const size_t start = i++;
    if (i >= fmt.size()) return Error("incomplete format");
    const Value* mapped = nullptr;
    if (fmt[i] == '(') {
      if (mapping == nullptr) return Error("format requires a mapping");
      const size_t close = fmt.find(')', i);
      if (close == std::string_view::npos)
        return Error("incomplete format key");
      mapped = mapping->FindStr(fmt.substr(i + 1, close - i - 1));
      if (mapped == nullptr) {
        std::string key;
        AppendStrRepr(fmt.substr(i + 1, close - i - 1), &key);
        return Error(key);
      }
      i = close + 1;
    }
    PercentSpec sp;
    for (; i < fmt.size(); ++i) {
      const char f = fmt[i];
      if (f == '-')
        sp.left = true;
      else if (f == '0')
        sp.zero = true;
      else if (f == '+')
        sp.plus = true;
      else if (f == ' ')
        sp.space = true;
      else if (f == '#')
        sp.alt = true;
      else
        break;
    }
    auto take_arg = [&]() -> absl::StatusOr<Value> {
      if (next >= positional.size()) {
        return Error("not enough arguments for format string");
      }
      return positional[next++];
    };
    auto read_num = [&](int* out_num) -> absl::Status {
      if (i < fmt.size() && fmt[i] == '*') {
        ++i;
        auto v = take_arg();
        if (!v.ok()) return v.status();
        if (!v->is_integral()) return Error("* wants int");
        *out_num = static_cast<int>(
            std::clamp<int64_t>(v->int_value(), -1, INT32_MAX));
        return absl::OkStatus();
      }
      int64_t n = 0;
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
        n = std::min<int64_t>(n * 10 + (fmt[i++] - '0'), INT32_MAX);
      }
      *out_num = static_cast<int>(n);
      return absl::OkStatus();
    };
    if (auto s = read_num(&sp.width); !s.ok()) return s;
    if (sp.width < 0) {
      sp.left = true;
      sp.width = -sp.width;
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      if (auto s = read_num(&sp.precision); !s.ok()) return s;
    }
    if (static_cast<size_t>(std::max(sp.width, sp.precision)) > max_bytes) {
      return TooLarge(std::max(sp.width, sp.precision), max_bytes);
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L'))
      ++i;
    if (i >= fmt.size()) return Error("incomplete format");
    const char type = fmt[i++];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (std::string_view("sradiuxXoeEfFgGc").find(type) ==
        std::string_view::npos) {
      char buf[96];
      std::snprintf(buf, sizeof(buf),
                    "unsupported format character '%c' (0x%x) at index %zu",
                    type, static_cast<unsigned char>(type), i - 1);
      (void)start;
      return Error(buf);
    }
    Value arg;
    if (mapped != nullptr) {
      arg = *mapped;
    } else {
      auto a = take_arg();
      if (!a.ok()) return a.status();
      arg = *std::move(a);
    }
    auto piece = PercentOne(type, sp, arg);
    if (!piece.ok()) return piece.status();
    out += *piece;
  }
  if (next < positional.size() && mapping == nullptr) {
    return Error("not all arguments converted during string formatting");
  }
  if (out.size() > max_bytes) return TooLarge(out.size(), max_bytes);
  return out;
}

}  // namespace pdserve::jinja
