// str.format() and format(value, spec): the format-spec mini-language.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/chat_template/pyformat.h"
#include "common/chat_template/text.h"

namespace pdserve::jinja {
namespace {

absl::Status Error(std::string msg) {
  return absl::InvalidArgumentError(std::move(msg));
}

// ------------------------------------------------------------- format(spec)

struct FormatSpec {
  char32_t fill = ' ';
  char align = 0;
  char sign = '-';
  bool alt = false;
  bool zero = false;
  int width = -1;
  char grouping = 0;
  int precision = -1;
  char type = 0;
};

absl::StatusOr<FormatSpec> ParseSpec(std::string_view spec, size_t max_bytes) {
  FormatSpec fs;
  size_t i = 0;
  auto is_align = [](char c) {
    return c == '<' || c == '>' || c == '=' || c == '^';
  };
  if (!spec.empty()) {
    size_t j = 0;
    const char32_t first = NextChar(spec, &j);
    if (j < spec.size() && is_align(spec[j])) {
      fs.fill = first;
      fs.align = spec[j];
      i = j + 1;
    } else if (is_align(spec[0])) {
      fs.align = spec[0];
      i = 1;
    }
  }
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) {
    fs.sign = spec[i++];
  }
  if (i < spec.size() && spec[i] == '#') {
    fs.alt = true;
    ++i;
  }
  if (i < spec.size() && spec[i] == '0') {
    fs.zero = true;
    ++i;
  }
  auto read_int = [&](int* out) {
    const size_t start = i;
    int64_t n = 0;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') {
      n = n * 10 + (spec[i++] - '0');
      if (n > static_cast<int64_t>(max_bytes)) n = max_bytes + 1;
    }
    if (i > start) *out = static_cast<int>(std::min<int64_t>(n, INT32_MAX));
    return i > start;
  };
  read_int(&fs.width);
  if (i < spec.size() && (spec[i] == ',' || spec[i] == '_'))
    fs.grouping = spec[i++];
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    if (!read_int(&fs.precision))
      return Error("Format specifier missing precision");
  }
  if (i < spec.size()) fs.type = spec[i++];
  if (i != spec.size()) return Error("Invalid format specifier");
  if (fs.width > 0 && static_cast<size_t>(fs.width) > max_bytes) {
    return TooLarge(fs.width, max_bytes);
  }
  if (fs.precision > 0 && static_cast<size_t>(fs.precision) > max_bytes) {
    return TooLarge(fs.precision, max_bytes);
  }
  if (fs.zero && fs.align == 0) {
    fs.fill = '0';
    fs.align = '=';
  }
  return fs;
}

std::string Align(const std::string& sign_prefix, const std::string& body,
                  const FormatSpec& fs, char default_align) {
  const size_t len = CharCount(sign_prefix) + CharCount(body);
  const char align = fs.align ? fs.align : default_align;
  if (fs.width <= 0 || len >= static_cast<size_t>(fs.width)) {
    return sign_prefix + body;
  }
  const size_t pad = fs.width - len;
  std::string fill;
  AppendUtf8(fs.fill, &fill);
  auto repeat = [&fill](size_t n) {
    std::string s;
    for (size_t k = 0; k < n; ++k) s += fill;
    return s;
  };
  switch (align) {
    case '<':
      return sign_prefix + body + repeat(pad);
    case '=':
      return sign_prefix + repeat(pad) + body;
    case '^':
      return repeat(pad / 2) + sign_prefix + body + repeat(pad - pad / 2);
    default:
      return repeat(pad) + sign_prefix + body;
  }
}

std::string SpecSign(bool negative, char sign) {
  if (negative) return "-";
  if (sign == '+') return "+";
  if (sign == ' ') return " ";
  return "";
}

absl::StatusOr<std::string> FormatFloat(double f, FormatSpec fs) {
  std::string body;
  char type = fs.type;
  if (type == 0 && fs.precision < 0) {
    body = FloatRepr(std::fabs(f));
  } else {
    if (type == 'n') type = 'g';
    const int precision = fs.precision < 0 ? 6 : fs.precision;
    if (type == '%') {
      body = FloatDigits(f * 100, 'f', precision, fs.alt) + "%";
    } else if (type == 0) {
      body = FloatDigits(f, 'g', std::max(precision, 1), fs.alt);
      if (std::isfinite(f) && body.find_first_of(".e") == std::string::npos) {
        body += ".0";
      }
    } else {
      body = FloatDigits(f, type, precision, fs.alt);
    }
  }
  if (fs.grouping && std::isfinite(f)) {
    size_t end = body.find_first_not_of("0123456789");
    if (end == std::string::npos) end = body.size();
    body = Group(body.substr(0, end), fs.grouping, 3) + body.substr(end);
  }
  return Align(SpecSign(std::signbit(f) && !std::isnan(f), fs.sign), body, fs,
               '>');
}

}  // namespace

absl::StatusOr<std::string> FormatValue(const Value& v, std::string_view spec,
                                        size_t max_bytes) {
  if (spec.empty()) return Str(v);
  auto parsed = ParseSpec(spec, max_bytes);
  if (!parsed.ok()) return parsed.status();
  FormatSpec fs = *parsed;
  auto unknown = [&]() {
    return Error(absl::StrCat("Unknown format code '", std::string(1, fs.type),
                              "' for object of type '", TypeName(v), "'"));
  };
  if (v.is_string()) {
    if (fs.type != 0 && fs.type != 's') return unknown();
    if (fs.align == '=') {
      return Error("'=' alignment not allowed in string format specifier");
    }
    if (fs.sign != '-')
      return Error("Sign not allowed in string format specifier");
    std::string s = v.str();
    if (fs.precision >= 0) {
      const std::vector<size_t> off = CharOffsets(s);
      if (static_cast<size_t>(fs.precision) + 1 < off.size()) {
        s.resize(off[fs.precision]);
      }
    }
    return Align("", s, fs, '<');
  }
  if (v.is_integral()) {
    const char t = fs.type;
    if (t == 'e' || t == 'E' || t == 'f' || t == 'F' || t == 'g' || t == 'G' ||
        t == '%') {
      return FormatFloat(static_cast<double>(v.int_value()), fs);
    }
    if (t == 'c') {
      std::string s;
      AppendUtf8(static_cast<char32_t>(v.int_value() & 0x1FFFFF), &s);
      return Align("", s, fs, '<');
    }
    if (t != 0 && t != 'd' && t != 'n' && t != 'x' && t != 'X' && t != 'o' &&
        t != 'b') {
      return unknown();
    }
    if (fs.precision >= 0) {
      return Error("Precision not allowed in integer format specifier");
    }
    std::string digits = IntDigits(v.int_value(), t == 0 || t == 'n' ? 'd' : t);
    if (fs.grouping) {
      digits =
          Group(digits, fs.grouping, (t == 0 || t == 'd' || t == 'n') ? 3 : 4);
    }
    std::string sign_prefix = SpecSign(v.int_value() < 0, fs.sign);
    if (fs.alt && t != 0 && t != 'd' && t != 'n') sign_prefix.append({'0', t});
    return Align(sign_prefix, digits, fs, '>');
  }
  if (v.is_float()) {
    const char t = fs.type;
    if (t != 0 && t != 'e' && t != 'E' && t != 'f' && t != 'F' && t != 'g' &&
        t != 'G' && t != 'n' && t != '%') {
      return unknown();
    }
    return FormatFloat(v.float_value(), fs);
  }
  return Error(absl::StrCat("unsupported format string passed to ", TypeName(v),
                            ".__format__"));
}

namespace {

// The state one str.format() call shares with its nested fields
// ("{:{width}}"): the arguments and the automatic field numbering.
struct FormatState {
  const std::vector<Value>& args;
  const std::vector<std::pair<std::string, Value>>& kwargs;
  size_t max_bytes;
  int auto_index = 0;
  bool manual = false;
  bool automatic = false;
};

absl::StatusOr<std::string> FormatFields(std::string_view fmt, FormatState& st,
                                         int depth) {
  const auto& args = st.args;
  const auto& kwargs = st.kwargs;
  const size_t max_bytes = st.max_bytes;
  int& auto_index = st.auto_index;
  bool& manual = st.manual;
  bool& automatic = st.automatic;
  std::string out;
  size_t i = 0;
  while (i < fmt.size()) {
    if (out.size() > max_bytes) return TooLarge(out.size(), max_bytes);
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      return Error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    size_t close = i + 1;
    for (int open = 1; close < fmt.size(); ++close) {
      if (fmt[close] == '{') ++open;
      if (fmt[close] == '}' && --open == 0) break;
    }
    if (close >= fmt.size()) {
      return Error(depth == 0 ? "Single '{' encountered in format string"
                              : "expected '}' before end of string");
    }
    std::string_view field = fmt.substr(i + 1, close - i - 1);
    i = close + 1;
    std::string_view spec;
    char conversion = 0;
    if (size_t colon = field.find(':'); colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (size_t bang = field.find('!'); bang != std::string_view::npos) {
      if (bang + 2 != field.size()) {
        return Error("expected ':' after conversion specifier");
      }
      conversion = field[bang + 1];
      field = field.substr(0, bang);
    }
    size_t name_end = field.find_first_of(".[");
    if (name_end == std::string_view::npos) name_end = field.size();
    const std::string_view name = field.substr(0, name_end);
    Value v;
    if (name.empty() || std::all_of(name.begin(), name.end(), [](char d) {
          return d >= '0' && d <= '9';
        })) {
      size_t index;
      if (name.empty()) {
        if (manual) {
          return Error(
              "cannot switch from manual field specification to "
              "automatic field numbering");
        }
        automatic = true;
        index = auto_index++;
      } else {
        if (automatic) {
          return Error(
              "cannot switch from automatic field numbering to "
              "manual field specification");
        }
        manual = true;
        index = std::strtoul(std::string(name).c_str(), nullptr, 10);
      }
      if (index >= args.size()) {
        return Error("tuple index out of range");
      }
      v = args[index];
    } else {
      bool found = false;
      for (const auto& [k, val] : kwargs) {
        if (k == name) {
          v = val;
          found = true;
        }
      }
      if (!found) {
        std::string key;
        AppendStrRepr(name, &key);
        return Error(key);
      }
    }
    // .attr and [key] on dicts and lists.
    size_t p = name_end;
    while (p < field.size()) {
      std::string key;
      const bool attr = field[p] == '.';
      if (attr) {
        const size_t end = field.find_first_of(".[", p + 1);
        key = std::string(field.substr(p + 1, end - p - 1));
        p = end == std::string_view::npos ? field.size() : end;
      } else {
        const size_t end = field.find(']', p);
        if (end == std::string_view::npos)
          return Error("Missing ']' in format string");
        key = std::string(field.substr(p + 1, end - p - 1));
        p = end + 1;
      }
      const Value* next = nullptr;
      Value holder;
      if (v.is_dict()) {
        next = v.dict().FindStr(key);
      } else if (v.is_list() && !attr && !key.empty() &&
                 std::all_of(key.begin(), key.end(),
                             [](char d) { return d >= '0' && d <= '9'; })) {
        const size_t index = std::strtoul(key.c_str(), nullptr, 10);
        if (index < v.list().items.size()) next = &v.list().items[index];
      }
      if (next == nullptr) {
        if (attr) {
          return Error(absl::StrCat("'", TypeName(v),
                                    "' object has no attribute '", key, "'"));
        }
        std::string k;
        AppendStrRepr(key, &k);
        return Error(k);
      }
      v = *next;
    }
    if (conversion == 'r' || conversion == 'a') {
      v = Value::String(Repr(v));
    } else if (conversion == 's') {
      v = Value::String(Str(v));
    } else if (conversion != 0) {
      return Error(absl::StrCat("Unknown conversion specifier ",
                                std::string(1, conversion)));
    }
    std::string nested_spec;
    if (spec.find('{') != std::string_view::npos) {
      if (depth >= 1) return Error("Max string recursion exceeded");
      auto formatted = FormatFields(spec, st, depth + 1);
      if (!formatted.ok()) return formatted.status();
      nested_spec = *std::move(formatted);
      spec = nested_spec;
    }
    auto piece = FormatValue(v, spec, max_bytes);
    if (!piece.ok()) return piece.status();
    out += *piece;
  }
  if (out.size() > max_bytes) return TooLarge(out.size(), max_bytes);
  return out;
}

}  // namespace

absl::StatusOr<std::string> StrFormat(
    std::string_view fmt, const std::vector<Value>& args,
    const std::vector<std::pair<std::string, Value>>& kwargs,
    size_t max_bytes) {
  FormatState state{args, kwargs, max_bytes};
  return FormatFields(fmt, state, 0);
}

}  // namespace pdserve::jinja
