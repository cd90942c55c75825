// str() and repr() of values, with CPython's formatting of floats and
// strings.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/chat_template/text.h"
#include "common/chat_template/value.h"

namespace pdserve::jinja {
namespace {
void AppendDepth(const Value& v, bool repr, int depth, std::string* out);

void AppendSeq(const std::vector<Value>& items, int depth, std::string* out) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out->append(", ");
    AppendDepth(items[i], true, depth + 1, out);
  }
}

void AppendDepth(const Value& v, bool repr, int depth, std::string* out) {
  if (depth > kMaxNesting) {
    out->append("...");
    return;
  }
  switch (v.kind()) {
    case Kind::kUndefined:
      if (repr) out->append("Undefined");
      return;
    case Kind::kNone:
      out->append("None");
      return;
    case Kind::kBool:
      out->append(v.bool_value() ? "True" : "False");
      return;
    case Kind::kInt:
      absl::StrAppend(out, v.int_value());
      return;
    case Kind::kFloat:
      out->append(FloatRepr(v.float_value()));
      return;
    case Kind::kString:
      if (repr) {
        AppendStrRepr(v.str(), out);
      } else {
        out->append(v.str());
      }
      return;
    case Kind::kList: {
      const ListData& l = v.list();
      switch (l.kind) {
        case SeqKind::kList:
          out->push_back('[');
          AppendSeq(l.items, depth, out);
          out->push_back(']');
          return;
        case SeqKind::kTuple:
          out->push_back('(');
          AppendSeq(l.items, depth, out);
          if (l.items.size() == 1) out->push_back(',');
          out->push_back(')');
          return;
        case SeqKind::kDictKeys:
          out->append("dict_keys([");
          break;
        case SeqKind::kDictValues:
          out->append("dict_values([");
          break;
        case SeqKind::kDictItems:
          out->append("dict_items([");
          break;
      }
      AppendSeq(l.items, depth, out);
      out->append("])");
      return;
    }
    case Kind::kDict: {
      out->push_back('{');
      bool first = true;
      for (const auto& [k, val] : v.dict().items()) {
        if (!first) out->append(", ");
        first = false;
        AppendDepth(k, true, depth + 1, out);
        out->append(": ");
        AppendDepth(val, true, depth + 1, out);
      }
      out->push_back('}');
      return;
    }
    case Kind::kCallable:
      out->append(v.callable().Repr());
      return;
    case Kind::kNamespace: {
      out->append("<Namespace {");
      bool first = true;
      for (const auto& [k, val] : v.ns().attrs) {
        if (!first) out->append(", ");
        first = false;
        AppendStrRepr(k, out);
        out->append(": ");
        AppendDepth(val, true, depth + 1, out);
      }
      out->append("}>");
      return;
    }
    case Kind::kLoop:
      out->append(LoopRepr(v.loop()));
      return;
    case Kind::kGenerator: {
      const GeneratorData& g = v.generator();
      if (g.type_name == "generator") {
        absl::StrAppend(out, "<generator object ", g.func_name,
                        " at 0x7f0000000000>");
      } else {
        absl::StrAppend(out, "<", g.type_name, " object at 0x7f0000000000>");
      }
      return;
    }
  }
}

}  // namespace

void AppendStr(const Value& v, std::string* out) {
  AppendDepth(v, false, 0, out);
}
void AppendRepr(const Value& v, std::string* out) {
  AppendDepth(v, true, 0, out);
}

std::string Str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  AppendStr(v, &out);
  return out;
}

std::string Repr(const Value& v) {
  std::string out;
  AppendRepr(v, &out);
  return out;
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto res =
      std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string_view s(buf, res.ptr - buf);
  std::string out;
  if (s[0] == '-') {
    out.push_back('-');
    s.remove_prefix(1);
  }
  const size_t epos = s.find('e');
  std::string digits;
  for (char c : s.substr(0, epos)) {
    if (c != '.') digits.push_back(c);
  }
  const int exp = std::atoi(std::string(s.substr(epos + 1)).c_str());
  const int decpt = exp + 1;  // value = 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (n > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+',
                  std::abs(exp));
    out.append(ebuf);
  } else if (decpt <= 0) {
    out.append("0.");
    out.append(-decpt, '0');
    out.append(digits);
  } else if (decpt >= n) {
    out.append(digits);
    out.append(decpt - n, '0');
    out.append(".0");
  } else {
    out.append(digits, 0, decpt);
    out.push_back('.');
    out.append(digits, decpt, std::string::npos);
  }
  return out;
}

void AppendStrRepr(std::string_view s, std::string* out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out->push_back(quote);
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t cp = NextChar(s, &i);
    char buf[16];
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out->append("\\t");
    } else if (cp == '\n') {
      out->append("\\n");
    } else if (cp == '\r') {
      out->append("\\r");
    } else if (cp < 0x20 || cp == 0x7F) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      out->append(buf);
    } else if (cp < 0x7F) {
      out->push_back(static_cast<char>(cp));
    } else if (cp == 0xFFFD && i - start != 3) {
      // An invalid byte (Python would hold a surrogate escape here).
      std::snprintf(buf, sizeof(buf), "\\udc%02x",
                    static_cast<unsigned char>(s[start]));
      out->append(buf);
    } else if (IsPyPrintable(cp)) {
      out->append(s.substr(start, i - start));
    } else if (cp <= 0xFF) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      out->append(buf);
    } else if (cp <= 0xFFFF) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out->append(buf);
    } else {
      std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
      out->append(buf);
    }
  }
  out->push_back(quote);
}

}  // namespace pdserve::jinja
