// jinja2's string filters (jinja2/filters.py): case, trim, replace,
// center, truncate, wordcount, indent, striptags. Each takes its input as
// jinja2 does, including what is not a string.
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/pyformat.h"
#include "common/chat_template/text.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;
using FilterFn = absl::StatusOr<Value> (*)(Renderer& r, const Value& v,
                                           CallArgs& args);

absl::StatusOr<Value> Trim(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_trim", a, {"chars"}));
  const std::string s = Str(v);
  if (args[0] && !args[0]->is_none()) {
    if (!args[0]->is_string()) {
      return RenderError(absl::StrCat("strip arg must be None or str"));
    }
    return Value::String(std::string(PyStrip(s, &args[0]->str(), true, true)));
  }
  return Value::String(std::string(PyStrip(s, nullptr, true, true)));
}

absl::StatusOr<Value> Upper(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("do_upper", a, {}).status());
  return CheckedString(r, PyUpper(Str(v)));
}
absl::StatusOr<Value> Lower(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("do_lower", a, {}).status());
  return CheckedString(r, PyLower(Str(v)));
}
absl::StatusOr<Value> Capitalize(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("do_capitalize", a, {}).status());
  return CheckedString(r, PyCapitalize(Str(v)));
}

// jinja2's title: words start after -, whitespace, (, {, [ or <.
absl::StatusOr<Value> Title(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("do_title", a, {}).status());
  const std::string s = Str(v);
  auto is_sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' ||
           IsPySpace(c);
  };
  std::string out;
  size_t i = 0;
  bool first_of_run = true;
  bool prev_sep = false;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t c = NextChar(s, &i);
    const bool sep = is_sep(c);
    if (start == 0 || sep != prev_sep) first_of_run = true;
    prev_sep = sep;
    std::string ch = s.substr(start, i - start);
    out += first_of_run ? PyUpper(ch) : PyLower(ch);
    first_of_run = false;
  }
  return CheckedString(r, std::move(out));
}

absl::StatusOr<Value> Replace(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args,
                   BindArgs("do_replace", a, {"old", "new", "count"}));
  if (!args[0] || !args[1]) {
    return RenderError("do_replace() missing required argument");
  }
  Value self = Value::String(Str(v));
  CallArgs m;
  m.args = {Value::String(Str(*args[0])), Value::String(Str(*args[1]))};
  if (args[2] && !args[2]->is_none()) m.args.push_back(*args[2]);
  return CallMethod(r, self, "replace", m);
}

absl::StatusOr<Value> Center(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_center", a, {"width"}));
  Value self = Value::String(Str(v));
  CallArgs m;
  m.args = {args[0] ? *args[0] : Value::Int(80)};
  return CallMethod(r, self, "center", m);
}

// do_truncate of what is not a string: len(s) as Python takes it, then
// (past length + leeway) s[:n] and `+ end` or `.rsplit(" ", 1)` on it.
absl::StatusOr<Value> TruncateNonString(const Value& v, int64_t length,
                                        int64_t leeway, bool killwords) {
  if (v.is_undefined()) return v;  // len() 0: returned as it is
  int64_t size;
  if (v.is_list()) {
    size = static_cast<int64_t>(v.list().items.size());
  } else if (v.is_dict()) {
    size = static_cast<int64_t>(v.dict().items().size());
  } else {
    return RenderError(
        absl::StrCat("object of type '", TypeName(v), "' has no len()"));
  }
  if (size <= length + leeway) return v;
  const std::string type = TypeName(v);
  if (v.is_dict()) return RenderError("unhashable type: 'slice'");
  if (type != "list" && type != "tuple") {
    return RenderError(
        absl::StrCat("'", type, "' object is not subscriptable"));
  }
  if (killwords) {
    return RenderError(absl::StrCat("can only concatenate ", type,
                                    " (not \"str\") to ", type));
  }
  return RenderError(
      absl::StrCat("'", type, "' object has no attribute 'rsplit'"));
}

absl::StatusOr<Value> Truncate(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(
      Args args,
      BindArgs("do_truncate", a, {"length", "killwords", "end", "leeway"}));
  const std::string s = Str(v);
  ASSIGN_OR_RETURN(int64_t length, IntArg(args[0], 255));
  const bool killwords = BoolArg(args[1], false);
  const std::string end = StrArg(args[2], "...");
  ASSIGN_OR_RETURN(int64_t leeway, IntArg(args[3], 5));
  const int64_t end_len = static_cast<int64_t>(CharCount(end));
  if (length < end_len) {
    return RenderError(
        absl::StrCat("expected length >= ", end_len, ", got ", length));
  }
  if (leeway < 0)
    return RenderError(absl::StrCat("expected leeway >= 0, got ", leeway));
  if (!v.is_string()) return TruncateNonString(v, length, leeway, killwords);
  const std::vector<size_t> off = CharOffsets(s);
  const int64_t n = static_cast<int64_t>(off.size()) - 1;
  if (n <= length || n - length <= leeway) return Value::String(s);
  std::string head = s.substr(0, off[std::min(n, length - end_len)]);
  if (!killwords) {
    const size_t space = head.rfind(' ');
    if (space != std::string::npos) head.resize(space);
  }
  return Value::String(head + end);
}

absl::StatusOr<Value> WordCount(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("do_wordcount", a, {}).status());
  const std::string s = Str(v);
  int64_t count = 0;
  bool in_word = false;
  size_t i = 0;
  while (i < s.size()) {
    const bool word = IsWordChar(NextChar(s, &i));
    if (word && !in_word) ++count;
    in_word = word;
  }
  return Value::Int(count);
}

std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> lines;
  size_t i = 0, start = 0;
  while (i < s.size()) {
    const size_t at = i;
    const char32_t c = NextChar(s, &i);
    if (!IsPyLinebreak(c)) continue;
    lines.push_back(s.substr(start, at - start));
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    start = i;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

absl::StatusOr<Value> Indent(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args,
                   BindArgs("do_indent", a, {"width", "first", "blank"}));
  std::string indention;
  if (args[0] && args[0]->is_string()) {
    indention = args[0]->str();
  } else {
    ASSIGN_OR_RETURN(int64_t width, IntArg(args[0], 4));
    if (width > static_cast<int64_t>(r.limits().max_string_bytes)) {
      return TooLarge(width, r.limits().max_string_bytes);
    }
    indention.assign(std::max<int64_t>(width, 0), ' ');
  }
  const bool first = BoolArg(args[1], false);
  const bool blank = BoolArg(args[2], false);
  // do_indent's `s += "\n"` (then s.splitlines()) on what is not a string.
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_string()) {
    const std::string type = TypeName(v);
    if (type == "list") {
      return RenderError("'list' object has no attribute 'splitlines'");
    }
    if (type == "tuple") {
      return RenderError("can only concatenate tuple (not \"str\") to tuple");
    }
    return RenderError(absl::StrCat("unsupported operand type(s) for +=: '",
                                    type, "' and 'str'"));
  }
  const std::string s = v.str() + "\n";
  const std::vector<std::string> lines = SplitLines(s);
  if (static_cast<double>(lines.size()) * indention.size() + s.size() >
      static_cast<double>(r.limits().max_string_bytes)) {
    return TooLarge(lines.size() * indention.size() + s.size(),
                    r.limits().max_string_bytes);
  }
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n" + indention;
      out += lines[i];
    }
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += indention;
      out += lines[i];
    }
  }
  if (first) out = indention + out;
  return CheckedString(r, std::move(out));
}

std::string HtmlUnescape(const std::string& s) {
  static const std::pair<std::string_view, std::string_view> kEntities[] = {
      {"amp", "&"},         {"lt", "<"},         {"gt", ">"},
      {"quot", "\""},       {"apos", "'"},       {"nbsp", "\u00a0"},
      {"raquo", "\u00bb"},  {"laquo", "\u00ab"}, {"copy", "\u00a9"},
      {"hellip", "\u2026"}, {"mdash", "\u2014"}, {"ndash", "\u2013"}};
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == std::string::npos || semi - i > 10) {
      out.push_back('&');
      continue;
    }
    const std::string name = s.substr(i + 1, semi - i - 1);
    bool done = false;
    if (!name.empty() && name[0] == '#') {
      const bool hex = name.size() > 1 && (name[1] | 0x20) == 'x';
      char* end = nullptr;
      const std::string digits = name.substr(hex ? 2 : 1);
      const long cp = std::strtol(digits.c_str(), &end, hex ? 16 : 10);
      if (!digits.empty() && *end == 0 && cp > 0 && cp <= 0x10FFFF) {
        AppendUtf8(static_cast<char32_t>(cp), &out);
        done = true;
      }
    } else {
      for (const auto& [entity, text] : kEntities) {
        if (name == entity) {
          out.append(text);
          done = true;
        }
      }
    }
    if (done) {
      i = semi;
    } else {
      out.push_back('&');
    }
  }
  return out;
}

absl::StatusOr<Value> StripTags(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("do_striptags", a, {}).status());
  std::string s = Str(v);
  for (size_t start; (start = s.find("<!--")) != std::string::npos;) {
    const size_t end = s.find("-->", start);
    if (end == std::string::npos) break;
    s.erase(start, end + 3 - start);
  }
  for (size_t start; (start = s.find('<')) != std::string::npos;) {
    const size_t end = s.find('>', start);
    if (end == std::string::npos) break;
    s.erase(start, end + 1 - start);
  }
  CallArgs none;
  ASSIGN_OR_RETURN(Value words, CallMethod(r, Value::String(s), "split", none));
  std::string joined;
  for (const Value& w : words.list().items) {
    if (!joined.empty()) joined += " ";
    joined += w.str();
  }
  return Value::String(HtmlUnescape(joined));
}

const absl::flat_hash_map<absl::string_view, FilterFn>& TextFilters() {
  static const auto* filters =
      new absl::flat_hash_map<absl::string_view, FilterFn>{
          {"trim", Trim},           {"upper", Upper},
          {"lower", Lower},         {"capitalize", Capitalize},
          {"title", Title},         {"replace", Replace},
          {"center", Center},       {"truncate", Truncate},
          {"wordcount", WordCount}, {"indent", Indent},
          {"striptags", StripTags}};
  return *filters;
}

}  // namespace

bool IsTextFilter(std::string_view name) {
  return TextFilters().contains(SV(name));
}

std::optional<absl::StatusOr<Value>> ApplyTextFilter(Renderer& r,
                                                     std::string_view name,
                                                     const Value& input,
                                                     CallArgs& args) {
  auto it = TextFilters().find(SV(name));
  if (it == TextFilters().end()) return std::nullopt;
  return it->second(r, input, args);
}

}  // namespace pdserve::jinja
