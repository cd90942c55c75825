// jinja2's tests (jinja2/tests.py): `x is defined`, `x is divisibleby 3`, ...
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/text.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {
namespace {

constexpr std::string_view kTests[] = {
    "odd",      "even",        "divisibleby", "defined", "undefined", "filter",
    "test",     "none",        "boolean",     "false",   "true",      "integer",
    "float",    "lower",       "upper",       "string",  "mapping",   "number",
    "sequence", "iterable",    "callable",    "sameas",  "escaped",   "in",
    "==",       "eq",          "equalto",     "!=",      "ne",        ">",
    "gt",       "greaterthan", ">=",          "ge",      "<",         "lt",
    "lessthan", "<=",          "le"};

// str.islower / str.isupper: a cased character, and no cased character of
// the other case.
bool CaseTest(const std::string& s, bool upper) {
  bool cased = false;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = NextChar(s, &i);
    if (upper ? (IsPyLower(c) || IsPyTitle(c))
              : (IsPyUpper(c) || IsPyTitle(c))) {
      return false;
    }
    if (upper ? IsPyUpper(c) : IsPyLower(c)) cased = true;
  }
  return cased;
}

bool SameAs(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return a.bool_value() == b.bool_value();
    case Kind::kInt:  // CPython caches small ints
      return a.int_value() == b.int_value() && a.int_value() >= -5 &&
             a.int_value() <= 256;
    case Kind::kUndefined:
    case Kind::kFloat:
      return false;
    case Kind::kString:
      return a.identity() == b.identity() ||
             (a.str() == b.str() && a.str().size() <= 1);
    default:
      return a.identity() == b.identity();
  }
}

absl::StatusOr<Value> OneArg(std::string_view test, const CallArgs& a) {
  if (a.args.size() + a.kwargs.size() != 1) {
    return RenderError(absl::StrCat("test_", SV(test),
                                    "() takes exactly one argument after the "
                                    "value"));
  }
  return a.args.empty() ? a.kwargs[0].second : a.args[0];
}

}  // namespace

bool IsKnownTest(std::string_view name) {
  for (std::string_view t : kTests) {
    if (t == name) return true;
  }
  return false;
}

absl::StatusOr<bool> ApplyTest(Renderer& r, std::string_view name,
                               const Value& v, CallArgs& a) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.bool_value();
  if (name == "false") return v.is_bool() && !v.bool_value();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "escaped") return false;
  if (name == "callable") {
    return v.is_callable() || v.is_undefined() || v.kind() == Kind::kLoop;
  }
  if (name == "sequence") {
    return v.is_string() || v.is_dict() || v.is_undefined() ||
           (v.is_list() && (v.seq_kind() == SeqKind::kList ||
                            v.seq_kind() == SeqKind::kTuple));
  }
  if (name == "iterable") {
    return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() ||
           v.kind() == Kind::kGenerator || v.kind() == Kind::kLoop;
  }
  if (name == "lower" || name == "upper")
    return CaseTest(Str(v), name == "upper");
  if (name == "odd" || name == "even") {
    ASSIGN_OR_RETURN(Value m, BinaryOp(r, BinOp::kMod, v, Value::Int(2)));
    return Equals(m, Value::Int(name == "odd" ? 1 : 0));
  }
  if (name == "filter" || name == "test") {  // `'upper' is filter`
    if (!v.is_string()) return false;
    return name == "filter" ? IsKnownFilter(v.str()) : IsKnownTest(v.str());
  }
  ASSIGN_OR_RETURN(Value other, OneArg(name, a));
  if (name == "divisibleby") {
    ASSIGN_OR_RETURN(Value m, BinaryOp(r, BinOp::kMod, v, other));
    return Equals(m, Value::Int(0));
  }
  if (name == "sameas") return SameAs(v, other);
  if (name == "in") return Contains(r, other, v);
  if (name == "==" || name == "eq" || name == "equalto")
    return Equals(v, other);
  if (name == "!=" || name == "ne") return !Equals(v, other);
  if (name == ">" || name == "gt" || name == "greaterthan") {
    return CompareOp(r, CmpOp::kGt, v, other);
  }
  if (name == ">=" || name == "ge") return CompareOp(r, CmpOp::kGe, v, other);
  if (name == "<" || name == "lt" || name == "lessthan") {
    return CompareOp(r, CmpOp::kLt, v, other);
  }
  if (name == "<=" || name == "le") return CompareOp(r, CmpOp::kLe, v, other);
  return RenderError(absl::StrCat("No test named '", SV(name), "' found."));
}

}  // namespace pdserve::jinja
