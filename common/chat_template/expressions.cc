// Expression evaluation and the sandbox's attribute/item access.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/evaluator.h"
#include "common/chat_template/text.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {
namespace {

Value Missing(const Value& obj, const Value& key) {
  auto info = std::make_shared<UndefinedInfo>();
  info->has_obj = true;
  info->obj_type = ObjectTypeRepr(obj);
  if (key.is_string()) {
    info->name = key.str();
  } else {
    info->name = Repr(key);
    info->name_is_str = false;
  }
  return Value::Undefined(std::move(info));
}

Value MissingAttr(const Value& obj, std::string_view name) {
  return Missing(obj, Value::String(std::string(name)));
}

Value Unsafe(const Value& obj, std::string_view name) {
  auto info = std::make_shared<UndefinedInfo>();
  info->name = std::string(name);
  info->has_obj = true;
  info->obj_type = ObjectTypeRepr(obj);
  info->hint = absl::StrCat("access to attribute '", SV(name), "' of '",
                            TypeName(obj), "' object is unsafe.");
  return Value::Undefined(std::move(info));
}

// Attributes every Python object (or most) has: the sandbox refuses them.
bool IsObjectDunder(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "__class__",        "__doc__",
      "__init__",         "__new__",
      "__repr__",         "__str__",
      "__hash__",         "__eq__",
      "__ne__",           "__lt__",
      "__le__",           "__gt__",
      "__ge__",           "__getattribute__",
      "__setattr__",      "__delattr__",
      "__dir__",          "__format__",
      "__reduce__",       "__reduce_ex__",
      "__sizeof__",       "__init_subclass__",
      "__subclasshook__", "__dict__",
      "__module__",       "__len__",
      "__iter__",         "__getitem__",
      "__contains__",     "__call__",
      "__globals__",      "__code__",
      "__mro__",          "__subclasses__",
      "__bases__",        "__base__",
      "__name__",         "__qualname__",
      "__func__",         "__self__",
      "__add__",          "__mul__",
      "__mod__",          "__weakref__"};
  for (std::string_view n : kNames) {
    if (n == name) return true;
  }
  return false;
}

// Attribute lookup without the item fallback (methods, loop and namespace
// attributes).
std::optional<Value> Attribute(const Value& obj, std::string_view name) {
  if (IsObjectDunder(name)) return Unsafe(obj, name);
  switch (FindMethod(obj, name)) {
    case MethodKind::kSafe:
      return Value::Callable(
          std::make_shared<BoundMethod>(obj, std::string(name)));
    case MethodKind::kUnsafe:
      return Unsafe(obj, name);
    case MethodKind::kNone:
      break;
  }
  switch (obj.kind()) {
    case Kind::kNamespace:
      if (const Value* v = obj.ns().Find(name)) return *v;
      break;
    case Kind::kCallable:
      return obj.callable().Attribute(name);
    case Kind::kBool:
    case Kind::kInt:
      if (name == "real" || name == "numerator")
        return Value::Int(obj.int_value());
      if (name == "imag") return Value::Int(0);
      if (name == "denominator") return Value::Int(1);
      break;
    case Kind::kFloat:
      if (name == "real") return obj;
      if (name == "imag") return Value::Float(0.0);
      break;
    default:
      break;
  }
  return std::nullopt;
}

std::string SliceRepr(const Value& a, const Value& b, const Value& c) {
  return absl::StrCat("slice(", Repr(a), ", ", Repr(b), ", ", Repr(c), ")");
}

}  // namespace

Value Renderer::Lookup(std::string_view name, const Scope& scope) const {
  if (const Value* v = scope.Find(name)) return *v;
  if (const Value* g = FindGlobal(name)) return *g;
  return Value::UndefinedNamed(std::string(name));
}

absl::StatusOr<Value> Renderer::GetAttr(const Value& obj,
                                        std::string_view name) {
  if (obj.is_undefined()) {
    // Undefined.__getattr__ raises, except for attributes it really has.
    if (IsObjectDunder(name)) return Unsafe(obj, name);
    return UndefinedError(obj);
  }
  if (obj.kind() == Kind::kLoop) return LoopAttr(obj, name);
  if (std::optional<Value> attr = Attribute(obj, name)) return *attr;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().FindStr(name)) return *v;
  }
  return MissingAttr(obj, name);
}

absl::StatusOr<Value> Renderer::GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  switch (obj.kind()) {
    case Kind::kString:
      if (key.is_integral()) {
        const std::string& str = obj.str();
        RETURN_IF_ERROR(Step(static_cast<int64_t>(str.size() / 64)));
        int64_t i = key.int_value();
        if (i < 0) i += static_cast<int64_t>(CharCount(str));
        if (i < 0) return Missing(obj, key);
        size_t pos = 0;
        for (int64_t k = 0; k < i && pos < str.size(); ++k) NextChar(str, &pos);
        if (pos >= str.size()) return Missing(obj, key);
        size_t end = pos;
        NextChar(str, &end);
        return Value::String(str.substr(pos, end - pos));
      }
      break;
    case Kind::kList:
      if (key.is_integral() && (obj.seq_kind() == SeqKind::kList ||
                                obj.seq_kind() == SeqKind::kTuple)) {
        const auto& items = obj.list().items;
        const int64_t n = static_cast<int64_t>(items.size());
        int64_t i = key.int_value();
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Missing(obj, key);
        return items[i];
      }
      break;
    case Kind::kDict:
      if (CheckHashable(key).ok()) {
        if (const Value* v = obj.dict().Find(key)) return *v;
      }
      break;
    case Kind::kLoop:
      if (key.is_string()) return LoopAttr(obj, key.str());
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (std::optional<Value> attr = Attribute(obj, key.str())) return *attr;
  }
  return Missing(obj, key);
}

absl::StatusOr<std::vector<Value>> Renderer::Iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return std::vector<Value>();
    case Kind::kList:
      return v.list().items;
    case Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().size());
      for (const auto& [k, val] : v.dict().items()) keys.push_back(k);
      return keys;
    }
    case Kind::kString:
      RETURN_IF_ERROR(Step(static_cast<int64_t>(v.str().size() / 16)));
      RETURN_IF_ERROR(CheckItems(CharCount(v.str())));
      return StringChars(v.str());
    case Kind::kGenerator: {
      GeneratorData& g = v.generator();
      std::vector<Value> rest(g.items.begin() + std::min(g.pos, g.items.size()),
                              g.items.end());
      g.pos = g.items.size();
      return rest;
    }
    default:
      return RenderError(
          absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<Value> Renderer::Call(const Value& callee, CallArgs& args) {
  switch (callee.kind()) {
    case Kind::kCallable:
      return callee.callable().Call(*this, args);
    case Kind::kUndefined:
      return UndefinedError(callee);
    case Kind::kLoop:
      return CallLoop(callee.loop(), args);
    default:
      return RenderError(
          absl::StrCat("'", TypeName(callee), "' object is not callable"));
  }
}

absl::StatusOr<Value> Renderer::Filter(std::string_view name,
                                       const Value& input, CallArgs& args) {
  return ApplyFilter(*this, name, input, args);
}

absl::StatusOr<bool> Renderer::Test(std::string_view name, const Value& v,
                                    CallArgs& args) {
  return ApplyTest(*this, name, v, args);
}

absl::StatusOr<Value> Renderer::Eval(const Expr& e, Scope& scope) {
  DepthGuard guard(this);
  RETURN_IF_ERROR(guard.Check());
  RETURN_IF_ERROR(Step());
  if (e.constant && !lenient_slices_ && e.kind != ExprKind::kConst) {
    // Folded by jinja2's optimizer where the value has a safe repr; else
    // evaluated at run time (its parts folded where they can be).
    absl::StatusOr<Value> folded = EvalConstant(e, scope);
    if (folded.ok() && HasSafeRepr(*folded)) return folded;
  }
  return EvalInner(e, scope);
}

absl::StatusOr<Value> Renderer::EvalBranch(const Expr* e, Scope& scope) {
  if (lenient_slices_ && (e == nullptr || !e->constant)) {
    // jinja2's as_const fails here (Impossible): evaluated at run time.
    return RenderError("not a constant");
  }
  return Eval(*e, scope);
}

absl::StatusOr<Value> Renderer::EvalConstant(const Expr& e, Scope& scope) {
  const bool was_lenient = lenient_slices_;
  lenient_slices_ = true;
  absl::StatusOr<Value> v = EvalInner(e, scope);
  lenient_slices_ = was_lenient;
  return v;
}

absl::Status Renderer::EvalArgs(const Expr& e, Scope& scope, CallArgs* args) {
  for (const auto& a : e.args) {
    ASSIGN_OR_RETURN(Value v, Eval(*a, scope));
    args->args.push_back(std::move(v));
  }
  for (const auto& [k, a] : e.kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*a, scope));
    args->kwargs.emplace_back(k, std::move(v));
  }
  if (e.dyn_args) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.dyn_args, scope));
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    for (auto& item : items) args->args.push_back(std::move(item));
  }
  if (e.dyn_kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.dyn_kwargs, scope));
    if (!v.is_dict()) {
      return RenderError(absl::StrCat(
          "argument after ** must be a mapping, not ", TypeName(v)));
    }
    for (const auto& [k, val] : v.dict().items()) {
      if (!k.is_string()) return RenderError("keywords must be strings");
      args->kwargs.emplace_back(k.str(), val);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Renderer::EvalFilterChain(const Expr* e, Scope& scope,
                                                const Value& input) {
  if (e == nullptr) return input;
  Value value = input;
  if (e->operands[0]) {
    ASSIGN_OR_RETURN(value,
                     EvalFilterChain(e->operands[0].get(), scope, input));
  }
  if (!e->known) {
    return RenderError(absl::StrCat("No filter named '", e->name, "' found."));
  }
  CallArgs args;
  RETURN_IF_ERROR(EvalArgs(*e, scope, &args));
  return Filter(e->name, value, args);
}

absl::StatusOr<Value> Renderer::EvalCompare(const Expr& e, Scope& scope) {
  ASSIGN_OR_RETURN(Value left, Eval(*e.operands[0], scope));
  for (size_t i = 0; i < e.cmp_ops.size(); ++i) {
    ASSIGN_OR_RETURN(Value right, Eval(*e.operands[i + 1], scope));
    ASSIGN_OR_RETURN(bool ok, CompareOp(*this, e.cmp_ops[i], left, right));
    if (!ok) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> Renderer::EvalSlice(const Value& obj, const Expr& slice,
                                          Scope& scope) {
  Value bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (slice.operands[i]) {
      ASSIGN_OR_RETURN(bounds[i], Eval(*slice.operands[i], scope));
    } else {
      bounds[i] = Value::None();
    }
  }
  if (obj.is_undefined()) return UndefinedError(obj);
  const bool seq =
      obj.is_string() || (obj.is_list() && (obj.seq_kind() == SeqKind::kList ||
                                            obj.seq_kind() == SeqKind::kTuple));
  auto missing = [&]() {
    auto info = std::make_shared<UndefinedInfo>();
    info->has_obj = true;
    info->obj_type = ObjectTypeRepr(obj);
    info->name = SliceRepr(bounds[0], bounds[1], bounds[2]);
    info->name_is_str = false;
    return Value::Undefined(std::move(info));
  };
  // Python's obj[start:stop:step] (jinja2 compiles slices to it).
  if (!seq) {
    if (lenient_slices_) return missing();
    if (obj.is_dict()) return RenderError("unhashable type: 'slice'");
    return RenderError(
        absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  for (const Value& b : bounds) {
    if (!b.is_none() && !b.is_integral()) {
      if (lenient_slices_) return missing();
      return RenderError(
          "slice indices must be integers or None or have an __index__ "
          "method");
    }
  }
  const int64_t step = bounds[2].is_none() ? 1 : bounds[2].int_value();
  if (step == 0) return RenderError("slice step cannot be zero");
  std::vector<size_t> offsets;
  int64_t n;
  if (obj.is_string()) {
    offsets = CharOffsets(obj.str());
    n = static_cast<int64_t>(offsets.size()) - 1;
  } else {
    n = static_cast<int64_t>(obj.list().items.size());
  }
  auto adjust = [&](const Value& b, int64_t def) {
    if (b.is_none()) return def;
    int64_t i = b.int_value();
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t start = adjust(bounds[0], step < 0 ? n - 1 : 0);
  const int64_t stop = adjust(bounds[1], step < 0 ? -1 : n);
  RETURN_IF_ERROR(Step(n / 16));
  if (obj.is_string()) {
    const std::string& s = obj.str();
    if (step == 1) {
      if (stop <= start) return Value::String("");
      return Value::String(
          s.substr(offsets[start], offsets[stop] - offsets[start]));
    }
    std::string out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
    }
    return Value::String(std::move(out));
  }
  std::vector<Value> out;
  const auto& items = obj.list().items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    out.push_back(items[i]);
  }
  return Value::List(std::move(out), obj.seq_kind());
}

absl::StatusOr<Value> Renderer::EvalInner(const Expr& e, Scope& scope) {
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName:
      return Lookup(e.name, scope);
    case ExprKind::kGetAttr: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0], scope));
      return GetAttr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0], scope));
      if (e.operands[1]->kind == ExprKind::kSlice) {
        return EvalSlice(obj, *e.operands[1], scope);
      }
      ASSIGN_OR_RETURN(Value key, Eval(*e.operands[1], scope));
      return GetItem(obj, key);
    }
    case ExprKind::kSlice:
      return RenderError("a slice cannot be used as a value");
    case ExprKind::kCall: {
      ASSIGN_OR_RETURN(Value callee, Eval(*e.operands[0], scope));
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e, scope, &args));
      return Call(callee, args);
    }
    case ExprKind::kFilter: {
      if (!e.operands[0]) return RenderError("filter without a value");
      ASSIGN_OR_RETURN(Value input, Eval(*e.operands[0], scope));
      if (!e.known) {
        return RenderError(
            absl::StrCat("No filter named '", e.name, "' found."));
      }
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e, scope, &args));
      return Filter(e.name, input, args);
    }
    case ExprKind::kTest: {
      ASSIGN_OR_RETURN(Value input, Eval(*e.operands[0], scope));
      if (!e.known) {
        return RenderError(absl::StrCat("No test named '", e.name, "' found."));
      }
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e, scope, &args));
      ASSIGN_OR_RETURN(bool result, Test(e.name, input, args));
      return Value::Bool(result);
    }
    case ExprKind::kNeg: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0], scope));
      return Negate(v);
    }
    case ExprKind::kPos: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0], scope));
      return UnaryPlus(v);
    }
    case ExprKind::kNot: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0], scope));
      return Value::Bool(!Truthy(v));
    }
    case ExprKind::kBinary: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0], scope));
      ASSIGN_OR_RETURN(Value b, Eval(*e.operands[1], scope));
      return BinaryOp(*this, e.op, a, b);
    }
    case ExprKind::kAnd: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0], scope));
      if (!Truthy(a)) return a;
      return EvalBranch(e.operands[1].get(), scope);
    }
    case ExprKind::kOr: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0], scope));
      if (Truthy(a)) return a;
      return EvalBranch(e.operands[1].get(), scope);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const auto& o : e.operands) {
        ASSIGN_OR_RETURN(Value v, Eval(*o, scope));
        AppendStr(v, &out);
        RETURN_IF_ERROR(CheckString(out.size()));
      }
      RETURN_IF_ERROR(Step(static_cast<int64_t>(out.size() / 64)));
      return Value::String(std::move(out));
    }
    case ExprKind::kCompare:
      return EvalCompare(e, scope);
    case ExprKind::kCondExpr: {
      ASSIGN_OR_RETURN(Value test, Eval(*e.operands[0], scope));
      if (Truthy(test)) return EvalBranch(e.operands[1].get(), scope);
      if (e.operands[2] || lenient_slices_) {
        return EvalBranch(e.operands[2].get(), scope);
      }
      auto info = std::make_shared<UndefinedInfo>();
      info->hint = absl::StrCat("the inline if-expression on line ", e.line,
                                " evaluated to false and no else section was "
                                "defined.");
      return Value::Undefined(std::move(info));
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.operands.size());
      for (const auto& o : e.operands) {
        ASSIGN_OR_RETURN(Value v, Eval(*o, scope));
        items.push_back(std::move(v));
      }
      return Checked(Value::List(std::move(items), e.kind == ExprKind::kList
                                                       ? SeqKind::kList
                                                       : SeqKind::kTuple));
    }
    case ExprKind::kDict: {
      auto dict = std::make_shared<DictData>();
      for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
        ASSIGN_OR_RETURN(Value k, Eval(*e.operands[i], scope));
        ASSIGN_OR_RETURN(Value v, Eval(*e.operands[i + 1], scope));
        RETURN_IF_ERROR(CheckHashable(k));
        dict->Set(std::move(k), std::move(v));
      }
      return Checked(Value::Dict(std::move(dict)));
    }
  }
  return RenderError("unknown expression");
}

}  // namespace pdserve::jinja
