// Global functions: jinja2's (range with the sandbox's MAX_RANGE, dict,
// namespace, joiner) and transformers' (raise_exception, strftime_now).
#include <ctime>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

absl::StatusOr<Value> Range(Renderer& r, CallArgs& a) {
  if (!a.kwargs.empty())
    return RenderError("range() takes no keyword arguments");
  if (a.args.empty() || a.args.size() > 3) {
    return RenderError(absl::StrCat("range expected at least 1 argument, got ",
                                    a.args.size()));
  }
  for (const Value& v : a.args) {
    if (!v.is_integral()) {
      if (v.is_undefined()) return UndefinedError(v);
      return RenderError(absl::StrCat(
          "'", TypeName(v), "' object cannot be interpreted as an integer"));
    }
  }
  int64_t start = 0, stop, step = 1;
  if (a.args.size() == 1) {
    stop = a.args[0].int_value();
  } else {
    start = a.args[0].int_value();
    stop = a.args[1].int_value();
    if (a.args.size() == 3) step = a.args[2].int_value();
  }
  if (step == 0) return RenderError("range() arg 3 must not be zero");
  // Length computed in 128 bits so that extreme bounds cannot overflow.
  __int128 len = 0;
  if (step > 0 && start < stop) {
    len = ((__int128)stop - start + step - 1) / step;
  } else if (step < 0 && start > stop) {
    len = ((__int128)start - stop - step - 1) / -(__int128)step;
  }
  if (len > kMaxRange) {
    return RenderError(absl::StrCat(
        "Range too big. The sandbox blocks ranges larger than MAX_RANGE (",
        kMaxRange, ")."));
  }
  RETURN_IF_ERROR(r.Step(static_cast<int64_t>(len)));
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(len));
  for (int64_t i = 0; i < static_cast<int64_t>(len); ++i) {
    items.push_back(Value::Int(start + i * step));
  }
  return Value::List(std::move(items));
}

// dict(*args, **kwargs) as Python builds it (shared with namespace()).
absl::StatusOr<std::vector<std::pair<Value, Value>>> DictItems(Renderer& r,
                                                               CallArgs& a,
                                                               const char* fn) {
  std::vector<std::pair<Value, Value>> out;
  if (a.args.size() > 1) {
    return RenderError(
        absl::StrCat(fn, " expected at most 1 argument, got ", a.args.size()));
  }
  if (a.args.size() == 1) {
    const Value& src = a.args[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict().items()) out.emplace_back(k, v);
    } else {
      ASSIGN_OR_RETURN(std::vector<Value> items, r.Iterate(src));
      for (size_t i = 0; i < items.size(); ++i) {
        ASSIGN_OR_RETURN(std::vector<Value> pair, r.Iterate(items[i]));
        if (pair.size() != 2) {
          return RenderError(
              absl::StrCat("dictionary update sequence element #", i,
                           " has length ", pair.size(), "; 2 is required"));
        }
        RETURN_IF_ERROR(CheckHashable(pair[0]));
        out.emplace_back(pair[0], pair[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kwargs) out.emplace_back(Value::String(k), v);
  return out;
}

absl::StatusOr<Value> Dict(Renderer& r, CallArgs& a) {
  ASSIGN_OR_RETURN(auto items, DictItems(r, a, "dict"));
  auto dict = std::make_shared<DictData>();
  for (auto& [k, v] : items) dict->Set(std::move(k), std::move(v));
  return r.Checked(Value::Dict(std::move(dict)));
}

absl::StatusOr<Value> Namespace(Renderer& r, CallArgs& a) {
  ASSIGN_OR_RETURN(auto items, DictItems(r, a, "namespace"));
  auto ns = r.NewNamespace();
  for (auto& [k, v] : items) {
    if (!k.is_string())
      return RenderError("namespace attribute names must be strings");
    if (Value* slot = ns->Find(k.str())) {
      *slot = std::move(v);
    } else {
      ns->attrs.emplace_back(k.str(), std::move(v));
    }
  }
  return Value::Namespace(std::move(ns));
}

// jinja2.utils.Joiner: "" the first time it is called, then the separator.
class Joiner : public Callable {
 public:
  explicit Joiner(std::string sep) : sep_(std::move(sep)) {}
  absl::StatusOr<Value> Call(Renderer& r, CallArgs& args) const override {
    if (!used_) {
      used_ = true;
      return Value::String("");
    }
    return Value::String(sep_);
  }
  std::string Repr() const override { return "<jinja2.utils.Joiner object>"; }
  std::string TypeName() const override { return "Joiner"; }

 private:
  std::string sep_;
  mutable bool used_ =
      false;  // per render: a joiner is created by the template
};

absl::StatusOr<Value> MakeJoiner(Renderer& r, CallArgs& a) {
  ASSIGN_OR_RETURN(auto args, BindArgs("joiner", a, {"sep"}));
  return Value::Callable(
      std::make_shared<Joiner>(args[0] ? Str(*args[0]) : ", "));
}

absl::StatusOr<Value> RaiseException(Renderer& r, CallArgs& a) {
  ASSIGN_OR_RETURN(auto args, BindArgs("raise_exception", a, {"message"}));
  return RenderError(args[0] ? Str(*args[0]) : "");
}

absl::StatusOr<Value> StrftimeNow(Renderer& r, CallArgs& a) {
  ASSIGN_OR_RETURN(auto args, BindArgs("strftime_now", a, {"format"}));
  if (!args[0] || !args[0]->is_string()) {
    return RenderError("strftime() argument 1 must be str");
  }
  const std::time_t now = r.now().value_or(std::time(nullptr));
  std::tm tm{};
  localtime_r(&now, &tm);
  // datetime.now() is naive: %z and %Z are empty, %f is microseconds.
  const std::string& fmt = args[0]->str();
  std::string c_fmt;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '%' && i + 1 < fmt.size()) {
      const char c = fmt[i + 1];
      ++i;
      if (c == 'z' || c == 'Z') continue;
      if (c == 'f') {
        c_fmt += "000000";
        continue;
      }
      c_fmt += '%';
      c_fmt += c;
    } else {
      c_fmt += fmt[i];
    }
  }
  if (c_fmt.size() > 4096) return RenderError("strftime format too long");
  std::string out(c_fmt.size() * 16 + 64, '\0');
  const size_t n = std::strftime(out.data(), out.size(), c_fmt.c_str(), &tm);
  out.resize(n);
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Unsupported(Renderer& r, CallArgs& a) {
  return RenderError(
      "cycler() and lipsum() are not supported by pdserve's chat "
      "template engine");
}

}  // namespace

const Value* FindGlobal(std::string_view name) {
  static const auto* globals = [] {
    auto* m = new absl::flat_hash_map<std::string, Value>();
    auto add = [m](const char* name, BuiltinFunction::Fn fn) {
      (*m)[name] = Value::Callable(std::make_shared<BuiltinFunction>(name, fn));
    };
    add("range", Range);
    add("dict", Dict);
    add("namespace", Namespace);
    add("joiner", MakeJoiner);
    add("cycler", Unsupported);
    add("lipsum", Unsupported);
    add("raise_exception", RaiseException);
    add("strftime_now", StrftimeNow);
    return m;
  }();
  auto it = globals->find(SV(name));
  return it == globals->end() ? nullptr : &it->second;
}

}  // namespace pdserve::jinja
