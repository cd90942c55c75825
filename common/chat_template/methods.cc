// Methods of Python's str, dict, list and tuple as a sandboxed template sees
// them: pure methods work; mutating ones (list.append, dict.update, ...) are
// refused like jinja2's ImmutableSandboxedEnvironment refuses them.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/pyformat.h"
#include "common/chat_template/text.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;

constexpr std::string_view kStrMethods[] = {
    "capitalize",   "casefold",  "center",       "count",        "endswith",
    "expandtabs",   "find",      "format",       "format_map",   "index",
    "isalnum",      "isalpha",   "isascii",      "isdecimal",    "isdigit",
    "isidentifier", "islower",   "isnumeric",    "isprintable",  "isspace",
    "istitle",      "isupper",   "join",         "ljust",        "lower",
    "lstrip",       "partition", "removeprefix", "removesuffix", "replace",
    "rfind",        "rindex",    "rjust",        "rpartition",   "rsplit",
    "rstrip",       "split",     "splitlines",   "startswith",   "strip",
    "swapcase",     "title",     "upper",        "zfill",        "encode",
    "translate",    "maketrans"};
constexpr std::string_view kDictSafe[] = {"get",    "items", "keys",
                                          "values", "copy",  "fromkeys"};
constexpr std::string_view kDictUnsafe[] = {"clear", "pop", "popitem",
                                            "setdefault", "update"};
constexpr std::string_view kListSafe[] = {"count", "index", "copy"};
constexpr std::string_view kListUnsafe[] = {
    "append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};

template <size_t N>
bool In(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

absl::StatusOr<std::string> StrArgOf(const std::optional<Value>& v,
                                     std::string_view fn) {
  if (!v || !v->is_string()) {
    return RenderError(absl::StrCat(SV(fn), "() argument must be str, not ",
                                    v ? TypeName(*v) : "missing"));
  }
  return v->str();
}

// [start:end] of s in characters, as byte offsets (Python slice rules).
std::pair<size_t, size_t> CharRange(const std::vector<size_t>& off,
                                    const std::optional<Value>& start,
                                    const std::optional<Value>& end) {
  const int64_t n = static_cast<int64_t>(off.size()) - 1;
  auto adjust = [n](const std::optional<Value>& v, int64_t def) {
    if (!v || !v->is_integral()) return def;
    int64_t i = v->int_value();
    if (i < 0) i = std::max<int64_t>(i + n, 0);
    return std::min(i, n);
  };
  const int64_t s = adjust(start, 0), e = adjust(end, n);
  if (e < s) return {off[s], off[s]};
  return {off[s], off[e]};
}

int64_t CharIndex(const std::vector<size_t>& off, size_t byte) {
  return std::lower_bound(off.begin(), off.end(), byte) - off.begin();
}

std::vector<Value> SplitWhitespace(const std::string& s, int64_t maxsplit,
                                   bool from_right) {
  // Work on characters so that multi-byte whitespace counts.
  std::vector<std::pair<size_t, size_t>> words;  // byte ranges
  size_t i = 0;
  size_t word_start = std::string::npos;
  while (i < s.size()) {
    const size_t at = i;
    const bool space = IsPySpace(NextChar(s, &i));
    if (space && word_start != std::string::npos) {
      words.emplace_back(word_start, at);
      word_start = std::string::npos;
    } else if (!space && word_start == std::string::npos) {
      word_start = at;
    }
  }
  if (word_start != std::string::npos) words.emplace_back(word_start, s.size());
  std::vector<Value> out;
  if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
    for (auto [b, e] : words) out.push_back(Value::String(s.substr(b, e - b)));
    return out;
  }
  if (!from_right) {
    for (int64_t k = 0; k < maxsplit; ++k) {
      out.push_back(Value::String(
          s.substr(words[k].first, words[k].second - words[k].first)));
    }
    out.push_back(Value::String(s.substr(words[maxsplit].first)));
    return out;
  }
  const size_t first_kept = words.size() - maxsplit;
  out.push_back(Value::String(s.substr(0, words[first_kept - 1].second)));
  for (size_t k = first_kept; k < words.size(); ++k) {
    out.push_back(Value::String(
        s.substr(words[k].first, words[k].second - words[k].first)));
  }
  return out;
}

absl::StatusOr<Value> Split(const std::string& s, const Args& args,
                            bool right) {
  int64_t maxsplit = -1;
  if (args[1]) {
    if (!args[1]->is_integral()) {
      return RenderError(
          absl::StrCat("'", TypeName(*args[1]),
                       "' object cannot be interpreted as an integer"));
    }
    maxsplit = args[1]->int_value();
  }
  if (!args[0] || args[0]->is_none()) {
    return Value::List(SplitWhitespace(s, maxsplit, right));
  }
  ASSIGN_OR_RETURN(std::string sep, StrArgOf(args[0], "split"));
  if (sep.empty()) return RenderError("empty separator");
  std::vector<std::string> parts;
  if (!right) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t found = s.find(sep, pos);
      if (found == std::string::npos) break;
      parts.push_back(s.substr(pos, found - pos));
      pos = found + sep.size();
    }
    parts.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    std::vector<std::string> rev;
    while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
      if (end < sep.size()) break;
      const size_t found = s.rfind(sep, end - sep.size());
      if (found == std::string::npos) break;
      rev.push_back(s.substr(found + sep.size(), end - found - sep.size()));
      end = found;
    }
    rev.push_back(s.substr(0, end));
    parts.assign(rev.rbegin(), rev.rend());
  }
  std::vector<Value> out;
  for (auto& p : parts) out.push_back(Value::String(std::move(p)));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Affix(const std::string& s, const Args& args, bool starts,
                            std::string_view fn) {
  const auto [b, e] = CharRange(CharOffsets(s), args[1], args[2]);
  const std::string_view part = std::string_view(s).substr(b, e - b);
  auto matches = [&](const std::string& p) {
    if (p.size() > part.size()) return false;
    return starts ? part.substr(0, p.size()) == p
                  : part.substr(part.size() - p.size()) == p;
  };
  if (args[0] && args[0]->is_string())
    return Value::Bool(matches(args[0]->str()));
  if (args[0] && args[0]->is_list() && args[0]->seq_kind() == SeqKind::kTuple) {
    for (const Value& p : args[0]->list().items) {
      if (!p.is_string()) {
        return RenderError(absl::StrCat(
            "tuple for ", SV(fn), " must only contain str, not ", TypeName(p)));
      }
      if (matches(p.str())) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  return RenderError(
      absl::StrCat(SV(fn), " first arg must be str or a tuple of str, not ",
                   args[0] ? TypeName(*args[0]) : "missing"));
}

absl::StatusOr<Value> Find(const std::string& s, const Args& args, bool right,
                           bool raise, bool count) {
  ASSIGN_OR_RETURN(std::string sub,
                   StrArgOf(args[0], count ? "count" : "find"));
  const std::vector<size_t> off = CharOffsets(s);
  const auto [b, e] = CharRange(off, args[1], args[2]);
  const std::string_view part = std::string_view(s).substr(b, e - b);
  if (count) {
    if (sub.empty())
      return Value::Int(static_cast<int64_t>(CharCount(part)) + 1);
    int64_t n = 0;
    for (size_t p = part.find(sub); p != std::string_view::npos;
         p = part.find(sub, p + sub.size())) {
      ++n;
    }
    return Value::Int(n);
  }
  const size_t found = right ? part.rfind(sub) : part.find(sub);
  if (found == std::string_view::npos) {
    if (raise) return RenderError("substring not found");
    return Value::Int(-1);
  }
  return Value::Int(CharIndex(off, b + found));
}

absl::StatusOr<Value> Justify(Renderer& r, const std::string& s,
                              const Args& args, char how) {
  if (!args[0] || !args[0]->is_integral()) {
    return RenderError("width must be an integer");
  }
  std::string fill = " ";
  if (args[1]) {
    if (!args[1]->is_string() || CharCount(args[1]->str()) != 1) {
      return RenderError(
          "The fill character must be exactly one character long");
    }
    fill = args[1]->str();
  }
  const int64_t width = args[0]->int_value();
  const int64_t len = static_cast<int64_t>(CharCount(s));
  if (width <= len) return Value::String(s);
  const int64_t marg = width - len;
  if (static_cast<uint64_t>(marg) > r.limits().max_string_bytes) {
    return r.CheckString(static_cast<size_t>(marg));
  }
  RETURN_IF_ERROR(r.CheckString(s.size() + marg * fill.size()));
  int64_t left = 0;
  if (how == 'c') left = marg / 2 + (marg & width & 1);
  if (how == 'r') left = marg;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = left; i < marg; ++i) out += fill;
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Replace(Renderer& r, const std::string& s,
                              const Args& args) {
  ASSIGN_OR_RETURN(std::string old_s, StrArgOf(args[0], "replace"));
  ASSIGN_OR_RETURN(std::string new_s, StrArgOf(args[1], "replace"));
  int64_t count = -1;
  if (args[2]) {
    if (!args[2]->is_integral()) return RenderError("count must be an integer");
    count = args[2]->int_value();
  }
  std::string out;
  int64_t done = 0;
  auto check = [&]() { return r.CheckString(out.size()); };
  if (old_s.empty()) {
    const std::vector<size_t> off = CharOffsets(s);
    for (size_t i = 0; i + 1 < off.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      out.append(s, off[i], off[i + 1] - off[i]);
      RETURN_IF_ERROR(check());
    }
    if (count < 0 || done < count) out += new_s;
  } else {
    size_t pos = 0;
    while (count < 0 || done < count) {
      const size_t found = s.find(old_s, pos);
      if (found == std::string::npos) break;
      out.append(s, pos, found - pos);
      out += new_s;
      pos = found + old_s.size();
      ++done;
      RETURN_IF_ERROR(check());
    }
    out.append(s, pos, std::string::npos);
  }
  RETURN_IF_ERROR(check());
  RETURN_IF_ERROR(r.Step(static_cast<int64_t>(out.size() / 64)));
  return Value::String(std::move(out));
}

template <typename Pred>
Value AllChars(const std::string& s, Pred pred) {
  if (s.empty()) return Value::Bool(false);
  size_t i = 0;
  while (i < s.size()) {
    if (!pred(NextChar(s, &i))) return Value::Bool(false);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> StrMethod(Renderer& r, const std::string& s,
                                std::string_view name, CallArgs& a) {
  auto bind = [&](std::initializer_list<std::string_view> params) {
    return BindArgs(absl::StrCat("str.", SV(name)), a, params);
  };
  if (name == "format") {
    ASSIGN_OR_RETURN(std::string out, StrFormat(s, a.args, a.kwargs,
                                                r.limits().max_string_bytes));
    return Value::String(std::move(out));
  }
  if (name == "format_map") {
    ASSIGN_OR_RETURN(Args args, bind({"mapping"}));
    if (!args[0] || !args[0]->is_dict())
      return RenderError("format_map() needs a dict");
    std::vector<std::pair<std::string, Value>> kwargs;
    for (const auto& [k, v] : args[0]->dict().items()) {
      if (k.is_string()) kwargs.emplace_back(k.str(), v);
    }
    ASSIGN_OR_RETURN(std::string out,
                     StrFormat(s, {}, kwargs, r.limits().max_string_bytes));
    return Value::String(std::move(out));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ASSIGN_OR_RETURN(Args args, bind({"chars"}));
    const std::string* chars = nullptr;
    if (args[0] && !args[0]->is_none()) {
      if (!args[0]->is_string()) {
        return RenderError(absl::StrCat(SV(name), " arg must be None or str"));
      }
      chars = &args[0]->str();
    }
    return Value::String(
        std::string(PyStrip(s, chars, name != "rstrip", name != "lstrip")));
  }
  if (name == "split" || name == "rsplit") {
    ASSIGN_OR_RETURN(Args args, bind({"sep", "maxsplit"}));
    return Split(s, args, name == "rsplit");
  }
  if (name == "splitlines") {
    ASSIGN_OR_RETURN(Args args, bind({"keepends"}));
    const bool keep = args[0] && Truthy(*args[0]);
    std::vector<Value> out;
    size_t i = 0, start = 0;
    while (i < s.size()) {
      const size_t at = i;
      const char32_t c = NextChar(s, &i);
      if (!IsPyLinebreak(c)) continue;
      if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
      out.push_back(Value::String(s.substr(start, (keep ? i : at) - start)));
      start = i;
    }
    if (start < s.size()) out.push_back(Value::String(s.substr(start)));
    return Value::List(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    ASSIGN_OR_RETURN(Args args, bind({"prefix", "start", "end"}));
    return Affix(s, args, name == "startswith", name);
  }
  if (name == "upper") return Value::String(PyUpper(s));
  if (name == "lower" || name == "casefold") return Value::String(PyLower(s));
  if (name == "title") return Value::String(PyTitle(s));
  if (name == "capitalize") return Value::String(PyCapitalize(s));
  if (name == "swapcase") return Value::String(PySwapCase(s));
  if (name == "replace") {
    ASSIGN_OR_RETURN(Args args, bind({"old", "new", "count"}));
    return Replace(r, s, args);
  }
  if (name == "find" || name == "rfind" || name == "index" ||
      name == "rindex" || name == "count") {
    ASSIGN_OR_RETURN(Args args, bind({"sub", "start", "end"}));
    return Find(s, args, name[0] == 'r', name == "index" || name == "rindex",
                name == "count");
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(Args args, bind({"iterable"}));
    if (!args[0])
      return RenderError("join() takes exactly one argument (0 given)");
    ASSIGN_OR_RETURN(std::vector<Value> items, r.Iterate(*args[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return RenderError(absl::StrCat("sequence item ", i,
                                        ": expected str instance, ",
                                        TypeName(items[i]), " found"));
      }
      if (i > 0) out += s;
      out += items[i].str();
      RETURN_IF_ERROR(r.CheckString(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    ASSIGN_OR_RETURN(Args args, bind({"width", "fillchar"}));
    return Justify(r, s, args,
                   name[0] == 'c'   ? 'c'
                   : name[0] == 'l' ? 'l'
                                    : 'r');
  }
  if (name == "zfill") {
    ASSIGN_OR_RETURN(Args args, bind({"width"}));
    if (!args[0] || !args[0]->is_integral())
      return RenderError("width must be an integer");
    const int64_t len = static_cast<int64_t>(CharCount(s));
    const int64_t width = args[0]->int_value();
    if (width <= len) return Value::String(s);
    RETURN_IF_ERROR(r.CheckString(s.size() + (width - len)));
    const size_t sign = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
    return Value::String(s.substr(0, sign) + std::string(width - len, '0') +
                         s.substr(sign));
  }
  if (name == "partition" || name == "rpartition") {
    ASSIGN_OR_RETURN(Args args, bind({"sep"}));
    ASSIGN_OR_RETURN(std::string sep, StrArgOf(args[0], name));
    if (sep.empty()) return RenderError("empty separator");
    const size_t found = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (found == std::string::npos) {
      if (name == "partition") {
        return Value::Tuple(
            {Value::String(s), Value::String(""), Value::String("")});
      }
      return Value::Tuple(
          {Value::String(""), Value::String(""), Value::String(s)});
    }
    return Value::Tuple({Value::String(s.substr(0, found)), Value::String(sep),
                         Value::String(s.substr(found + sep.size()))});
  }
  if (name == "removeprefix" || name == "removesuffix") {
    ASSIGN_OR_RETURN(Args args, bind({"affix"}));
    ASSIGN_OR_RETURN(std::string affix, StrArgOf(args[0], name));
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) {
      return Value::String(s.substr(affix.size()));
    }
    if (name == "removesuffix" && s.size() >= affix.size() &&
        s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Value::String(s.substr(0, s.size() - affix.size()));
    }
    return Value::String(s);
  }
  RETURN_IF_ERROR(bind({}).status());
  if (name == "isalnum") return AllChars(s, IsPyAlnum);
  if (name == "isalpha") return AllChars(s, IsPyAlpha);
  if (name == "isdecimal") return AllChars(s, IsPyDecimal);
  if (name == "isdigit") return AllChars(s, IsPyDigit);
  if (name == "isnumeric") return AllChars(s, IsPyNumeric);
  if (name == "isspace") return AllChars(s, IsPySpace);
  if (name == "isascii") {
    return Value::Bool(std::all_of(s.begin(), s.end(),
                                   [](char c) { return (c & 0x80) == 0; }));
  }
  if (name == "isprintable") {
    if (s.empty()) return Value::Bool(true);
    return AllChars(s, IsPyPrintable);
  }
  if (name == "isidentifier") {
    if (s.empty()) return Value::Bool(false);
    size_t i = 0;
    const char32_t first = NextChar(s, &i);
    if (first != '_' && !IsPyAlpha(first)) return Value::Bool(false);
    return AllChars(s.substr(i).empty() ? std::string("a") : s.substr(i),
                    IsWordChar);
  }
  if (name == "islower" || name == "isupper") {
    bool cased = false, ok = true;
    size_t i = 0;
    while (i < s.size()) {
      const char32_t c = NextChar(s, &i);
      const bool up = IsPyUpper(c) || IsPyTitle(c), low = IsPyLower(c);
      if (name == "islower" ? up : low) ok = false;
      if (name == "islower" ? low : IsPyUpper(c)) cased = true;
    }
    return Value::Bool(ok && cased);
  }
  if (name == "istitle") {
    bool cased = false, prev_cased = false;
    size_t i = 0;
    while (i < s.size()) {
      const char32_t c = NextChar(s, &i);
      if (IsPyUpper(c) || IsPyTitle(c)) {
        if (prev_cased) return Value::Bool(false);
        prev_cased = cased = true;
      } else if (IsPyLower(c)) {
        if (!prev_cased) return Value::Bool(false);
        prev_cased = cased = true;
      } else {
        prev_cased = false;
      }
    }
    return Value::Bool(cased);
  }
  return RenderError(absl::StrCat("str.", SV(name),
                                  "() is not supported by pdserve's chat "
                                  "template engine"));
}

absl::StatusOr<Value> DictMethod(Renderer& r, const Value& self,
                                 std::string_view name, CallArgs& a) {
  const DictData& d = self.dict();
  auto bind = [&](std::initializer_list<std::string_view> params) {
    return BindArgs(absl::StrCat("dict.", SV(name)), a, params);
  };
  if (name == "get") {
    ASSIGN_OR_RETURN(Args args, bind({"key", "default"}));
    if (!args[0]) return RenderError("get expected at least 1 argument, got 0");
    RETURN_IF_ERROR(CheckHashable(*args[0]));
    if (const Value* v = d.Find(*args[0])) return *v;
    return args[1] ? *args[1] : Value::None();
  }
  RETURN_IF_ERROR(bind({}).status());
  std::vector<Value> out;
  if (name == "copy") {
    auto copy = std::make_shared<DictData>(d);
    return Value::Dict(std::move(copy));
  }
  for (const auto& [k, v] : d.items()) {
    if (name == "keys") out.push_back(k);
    if (name == "values") out.push_back(v);
    if (name == "items") out.push_back(Value::Tuple({k, v}));
  }
  if (name == "keys") return Value::List(std::move(out), SeqKind::kDictKeys);
  if (name == "values")
    return Value::List(std::move(out), SeqKind::kDictValues);
  if (name == "items") return Value::List(std::move(out), SeqKind::kDictItems);
  return RenderError(absl::StrCat("dict.", SV(name), "() is not supported"));
}

absl::StatusOr<Value> ListMethod(Renderer& r, const Value& self,
                                 std::string_view name, CallArgs& a) {
  const auto& items = self.list().items;
  const std::string type = TypeName(self);
  if (name == "copy") {
    RETURN_IF_ERROR(BindArgs("list.copy", a, {}).status());
    return Value::List(items, self.seq_kind());
  }
  ASSIGN_OR_RETURN(Args args, BindArgs(absl::StrCat(type, ".", SV(name)), a,
                                       {"value", "start", "stop"}));
  if (!args[0])
    return RenderError(absl::StrCat(SV(name), "() takes at least 1 argument"));
  if (name == "count") {
    int64_t n = 0;
    for (const Value& v : items) n += Equals(v, *args[0]) ? 1 : 0;
    return Value::Int(n);
  }
  const int64_t size = static_cast<int64_t>(items.size());
  auto bound = [size](const std::optional<Value>& v, int64_t def) {
    if (!v || !v->is_integral()) return def;
    int64_t i = v->int_value();
    if (i < 0) i = std::max<int64_t>(i + size, 0);
    return std::min(i, size);
  };
  for (int64_t i = bound(args[1], 0); i < bound(args[2], size); ++i) {
    if (Equals(items[i], *args[0])) return Value::Int(i);
  }
  if (type == "tuple") return RenderError("tuple.index(x): x not in tuple");
  return RenderError(absl::StrCat(Repr(*args[0]), " is not in list"));
}

}  // namespace

MethodKind FindMethod(const Value& self, std::string_view name) {
  switch (self.kind()) {
    case Kind::kString:
      return In(kStrMethods, name) ? MethodKind::kSafe : MethodKind::kNone;
    case Kind::kDict:
      if (In(kDictSafe, name)) return MethodKind::kSafe;
      return In(kDictUnsafe, name) ? MethodKind::kUnsafe : MethodKind::kNone;
    case Kind::kList:
      if (self.seq_kind() == SeqKind::kList) {
        if (In(kListSafe, name)) return MethodKind::kSafe;
        return In(kListUnsafe, name) ? MethodKind::kUnsafe : MethodKind::kNone;
      }
      if (self.seq_kind() == SeqKind::kTuple) {
        return (name == "count" || name == "index") ? MethodKind::kSafe
                                                    : MethodKind::kNone;
      }
      return MethodKind::kNone;
    case Kind::kFloat:
      return name == "is_integer" ? MethodKind::kSafe : MethodKind::kNone;
    default:
      return MethodKind::kNone;
  }
}

absl::StatusOr<Value> CallMethod(Renderer& r, const Value& self,
                                 std::string_view name, CallArgs& args) {
  RETURN_IF_ERROR(r.Step());
  switch (self.kind()) {
    case Kind::kString: {
      ASSIGN_OR_RETURN(Value v, StrMethod(r, self.str(), name, args));
      if (v.is_string()) RETURN_IF_ERROR(r.CheckString(v.str().size()));
      return v;
    }
    case Kind::kDict:
      if (name == "fromkeys") break;
      return DictMethod(r, self, name, args);
    case Kind::kList:
      return ListMethod(r, self, name, args);
    case Kind::kFloat:
      if (name == "is_integer") {
        RETURN_IF_ERROR(BindArgs("float.is_integer", args, {}).status());
        const double f = self.float_value();
        return Value::Bool(std::isfinite(f) && f == std::floor(f));
      }
      break;
    default:
      break;
  }
  return RenderError(absl::StrCat("'", TypeName(self),
                                  "' object has no method '", SV(name), "'"));
}

}  // namespace pdserve::jinja
