// jinja2's scalar filters (jinja2/filters.py: default, conversions,
// numbers, escaping), transformers' tojson, the filter argument helpers and
// the filter dispatch. String filters: filters_text.cc; sequence filters:
// filters_seq.cc.
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/pyformat.h"
#include "common/chat_template/text.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {
absl::StatusOr<int64_t> IntArg(const std::optional<Value>& v, int64_t def) {
  if (!v || v->is_none()) return def;
  if (!v->is_integral()) {
    return RenderError(absl::StrCat("'", TypeName(*v),
                                    "' object cannot be interpreted as an "
                                    "integer"));
  }
  return v->int_value();
}

bool BoolArg(const std::optional<Value>& v, bool def) {
  return v ? Truthy(*v) : def;
}

std::string StrArg(const std::optional<Value>& v, std::string_view def) {
  return v ? Str(*v) : std::string(def);
}

absl::StatusOr<Value> CheckedString(Renderer& r, std::string s) {
  RETURN_IF_ERROR(r.CheckString(s.size()));
  RETURN_IF_ERROR(r.Step(static_cast<int64_t>(s.size() / 64)));
  return Value::String(std::move(s));
}

namespace {

using Args = std::vector<std::optional<Value>>;
using FilterFn = absl::StatusOr<Value> (*)(Renderer& r, const Value& v,
                                           CallArgs& args);

absl::StatusOr<Value> Default(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args,
                   BindArgs("do_default", a, {"default_value", "boolean"}));
  if (v.is_undefined() || (BoolArg(args[1], false) && !Truthy(v))) {
    return args[0] ? *args[0] : Value::String("");
  }
  return v;
}

absl::StatusOr<Value> String(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("soft_str", a, {}).status());
  return CheckedString(r, Str(v));
}

absl::StatusOr<Value> Int(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_int", a, {"default", "base"}));
  const Value def = args[0] ? *args[0] : Value::Int(0);
  ASSIGN_OR_RETURN(int64_t base, IntArg(args[1], 10));
  if (v.is_undefined()) return UndefinedError(v);  // int(Undefined) raises
  if (v.is_integral()) return Value::Int(v.int_value());
  if (v.is_string()) {
    if (auto i = ParsePyInt(v.str(), static_cast<int>(base)))
      return Value::Int(*i);
    if (auto f = ParsePyFloat(v.str())) {
      if (std::isnan(*f)) return def;
      if (std::isinf(*f))
        return RenderError("cannot convert float infinity to integer");
      if (std::fabs(*f) >= 9.2e18) return RenderError("integer overflow");
      return Value::Int(static_cast<int64_t>(*f));
    }
    return def;
  }
  if (v.is_float()) {
    const double f = v.float_value();
    if (std::isnan(f)) return def;
    if (std::isinf(f))
      return RenderError("cannot convert float infinity to integer");
    if (std::fabs(f) >= 9.2e18) return RenderError("integer overflow");
    return Value::Int(static_cast<int64_t>(f));
  }
  return def;
}

absl::StatusOr<Value> Float(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_float", a, {"default"}));
  const Value def = args[0] ? *args[0] : Value::Float(0.0);
  if (v.is_undefined()) return UndefinedError(v);  // float(Undefined) raises
  if (v.is_number()) return Value::Float(v.AsDouble());
  if (v.is_string()) {
    if (auto f = ParsePyFloat(v.str())) return Value::Float(*f);
  }
  return def;
}

absl::StatusOr<Value> Abs(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("abs", a, {}).status());
  if (v.is_integral()) {
    if (v.int_value() == INT64_MIN) return RenderError("integer overflow");
    return Value::Int(std::abs(v.int_value()));
  }
  if (v.is_float()) return Value::Float(std::fabs(v.float_value()));
  return RenderError(
      absl::StrCat("bad operand type for abs(): '", TypeName(v), "'"));
}

// Python's round(x, n) for floats: correctly rounded, ties to even.
double RoundFloat(double x, int64_t n) {
  if (!std::isfinite(x)) return x;
  if (n >= 0) {
    if (n > 330) return x;
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(n), x);
    return std::strtod(buf, nullptr);
  }
  if (n < -330) return std::copysign(0.0, x);
  const double p = std::pow(10.0, static_cast<double>(-n));
  return std::nearbyint(x / p) * p;
}

absl::StatusOr<Value> Round(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_round", a, {"precision", "method"}));
  ASSIGN_OR_RETURN(int64_t precision, IntArg(args[0], 0));
  const std::string method = StrArg(args[1], "common");
  if (method != "common" && method != "ceil" && method != "floor") {
    return RenderError("method must be common, ceil or floor");
  }
  if (!v.is_number()) {
    return RenderError(
        absl::StrCat("type ", TypeName(v), " doesn't define __round__ method"));
  }
  if (method == "common") {
    if (v.is_float()) {
      if (std::isinf(v.float_value()) && args[0]) return v;
      return Value::Float(RoundFloat(v.float_value(), precision));
    }
    if (precision >= 0) return Value::Int(v.int_value());
    const double rounded =
        RoundFloat(static_cast<double>(v.int_value()), precision);
    if (std::fabs(rounded) >= 9.2e18) return RenderError("integer overflow");
    return Value::Int(static_cast<int64_t>(rounded));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.AsDouble() * scale;
  x = method == "ceil" ? std::ceil(x) : std::floor(x);
  return Value::Float(x / scale);
}

absl::StatusOr<Value> Safe(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("do_mark_safe", a, {}).status());
  return v.is_string() ? v : Value::String(Str(v));
}

absl::StatusOr<Value> Escape(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("escape", a, {}).status());
  std::string out;
  for (char c : Str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return CheckedString(r, std::move(out));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys).
absl::StatusOr<Value> ToJson(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("tojson", a,
                                       {"ensure_ascii", "indent", "separators",
                                        "sort_keys"}));
  JsonDumpOptions o;
  o.ensure_ascii = BoolArg(args[0], false);
  if (args[1] && !args[1]->is_none()) {
    if (args[1]->is_string()) {
      o.indent = args[1]->str();
    } else if (args[1]->is_integral()) {
      const int64_t n = args[1]->int_value();
      if (n > 1024) return RenderError("tojson indent too large");
      o.indent = std::string(std::max<int64_t>(n, 0), ' ');
    } else {
      return RenderError(
          absl::StrCat("can't multiply sequence by non-int of type '",
                       TypeName(*args[1]), "'"));
    }
    o.item_separator.assign(1, ',');
  }
  if (args[2] && !args[2]->is_none()) {
    const Value& sep = *args[2];
    if (!sep.is_list() || sep.list().items.size() != 2 ||
        !sep.list().items[0].is_string() || !sep.list().items[1].is_string()) {
      return RenderError("separators must be a pair of strings");
    }
    o.item_separator = sep.list().items[0].str();
    o.key_separator = sep.list().items[1].str();
  }
  o.sort_keys = BoolArg(args[3], false);
  std::string out;
  RETURN_IF_ERROR(JsonDump(v, o, r.limits().max_string_bytes, &out));
  return CheckedString(r, std::move(out));
}

absl::StatusOr<Value> Format(Renderer& r, const Value& v, CallArgs& a) {
  if (!a.args.empty() && !a.kwargs.empty()) {
    return RenderError(
        "can't handle positional and keyword arguments at the same time");
  }
  Value args;
  if (!a.kwargs.empty()) {
    auto dict = std::make_shared<DictData>();
    for (const auto& [k, val] : a.kwargs) dict->Set(Value::String(k), val);
    args = Value::Dict(std::move(dict));
  } else {
    args = Value::Tuple(a.args);
  }
  ASSIGN_OR_RETURN(std::string s,
                   PercentFormat(Str(v), args, r.limits().max_string_bytes));
  return Value::String(std::move(s));
}

absl::StatusOr<Value> Attr(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_attr", a, {"name"}));
  if (!args[0])
    return RenderError("do_attr() missing required argument: 'name'");
  const std::string name = Str(*args[0]);
  if (v.is_dict()) {
    // Dict keys are items, not attributes: only methods resolve.
    if (FindMethod(v, name) == MethodKind::kNone) {
      auto info = std::make_shared<UndefinedInfo>();
      info->name = name;
      info->has_obj = true;
      info->obj_type = ObjectTypeRepr(v);
      return Value::Undefined(std::move(info));
    }
  }
  return r.GetAttr(v, name);
}

absl::StatusOr<Value> FileSizeFormat(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_filesizeformat", a, {"binary"}));
  double bytes;
  if (v.is_number()) {
    bytes = v.AsDouble();
  } else if (auto f = v.is_string() ? ParsePyFloat(v.str()) : std::nullopt) {
    bytes = *f;
  } else {
    return RenderError(
        absl::StrCat("float() argument must be a string or a real "
                     "number, not '",
                     TypeName(v), "'"));
  }
  const bool binary = BoolArg(args[0], false);
  const double base = binary ? 1024 : 1000;
  static const char* kBinary[] = {"KiB", "MiB", "GiB", "TiB",
                                  "PiB", "EiB", "ZiB", "YiB"};
  static const char* kDecimal[] = {"kB", "MB", "GB", "TB",
                                   "PB", "EB", "ZB", "YB"};
  if (bytes == 1) return Value::String("1 Byte");
  if (bytes < base) {
    return Value::String(absl::StrCat(static_cast<int64_t>(bytes), " Bytes"));
  }
  double unit = base;
  int i = 0;
  for (; i < 8; ++i) {
    unit = std::pow(base, i + 2);
    if (bytes < unit) break;
  }
  if (i == 8) i = 7;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f %s", base * bytes / unit,
                binary ? kBinary[i] : kDecimal[i]);
  return Value::String(buf);
}

const absl::flat_hash_map<absl::string_view, FilterFn>& ScalarFilters() {
  static const auto* filters =
      new absl::flat_hash_map<absl::string_view, FilterFn>{
          {"default", Default},
          {"d", Default},
          {"string", String},
          {"int", Int},
          {"float", Float},
          {"abs", Abs},
          {"round", Round},
          {"safe", Safe},
          {"escape", Escape},
          {"e", Escape},
          {"forceescape", Escape},
          {"tojson", ToJson},
          {"format", Format},
          {"attr", Attr},
          {"filesizeformat", FileSizeFormat}};
  return *filters;
}

// jinja2 filters this engine recognizes but does not implement.
bool IsUnsupportedFilter(std::string_view name) {
  return name == "groupby" || name == "pprint" || name == "random" ||
         name == "urlencode" || name == "urlize" || name == "wordwrap" ||
         name == "xmlattr";
}

bool IsSequenceFilter(std::string_view name) {
  static const char* kNames[] = {
      "first",  "last",       "length",    "count",  "list",    "join",
      "items",  "dictsort",   "sort",      "unique", "reverse", "batch",
      "slice",  "min",        "max",       "sum",    "map",     "select",
      "reject", "selectattr", "rejectattr"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

}  // namespace

bool IsKnownFilter(std::string_view name) {
  return ScalarFilters().contains(SV(name)) || IsTextFilter(name) ||
         IsSequenceFilter(name) || IsUnsupportedFilter(name);
}

absl::StatusOr<Value> ApplyFilter(Renderer& r, std::string_view name,
                                  const Value& input, CallArgs& args) {
  auto it = ScalarFilters().find(SV(name));
  if (it != ScalarFilters().end()) return it->second(r, input, args);
  if (auto result = ApplyTextFilter(r, name, input, args)) return *result;
  if (auto result = ApplySequenceFilter(r, name, input, args)) return *result;
  if (IsUnsupportedFilter(name)) {
    return RenderError(absl::StrCat("the '", SV(name),
                                    "' filter is not supported by pdserve's "
                                    "chat template engine"));
  }
  return RenderError(absl::StrCat("No filter named '", SV(name), "' found."));
}

}  // namespace pdserve::jinja
