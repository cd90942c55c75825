// Statements, scoping, macros and loops. Expressions: expressions.cc.
#include "common/chat_template/evaluator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/pyformat.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {

absl::Status RenderError(std::string message) {
  return absl::InvalidArgumentError(std::move(message));
}

absl::Status UndefinedError(const Value& undefined) {
  const UndefinedInfo* info = undefined.undefined_info();
  return RenderError(info != nullptr ? info->Message() : "undefined value");
}

const Value* Scope::Find(std::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::Set(std::string_view name, Value v) {
  for (auto& [k, old] : vars) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars.emplace_back(std::string(name), std::move(v));
}

std::string BuiltinFunction::Repr() const {
  return absl::StrCat("<function ", name_, " at 0x7f0000000000>");
}

std::string BoundMethod::Repr() const {
  return absl::StrCat("<built-in method ", name_, " of ",
                      jinja::TypeName(self_), " object at 0x7f0000000000>");
}

std::string LoopRepr(const LoopData& loop) {
  return absl::StrCat("<LoopContext ", loop.index0 + 1, "/", loop.items.size(),
                      ">");
}

namespace {

// A macro, or the `caller` of a call block: its definition and the scope it
// was defined in (a closure).
class MacroCallable : public Callable {
 public:
  MacroCallable(const Stmt* def, std::string name,
                std::shared_ptr<Scope> closure)
      : def_(def), name_(std::move(name)), closure_(std::move(closure)) {}
  absl::StatusOr<Value> Call(Renderer& r, CallArgs& args) const override {
    return r.CallMacro(*def_, name_, closure_, args);
  }
  std::string Repr() const override {
    return absl::StrCat("<Macro '", name_, "'>");
  }
  std::string TypeName() const override { return "Macro"; }
  std::optional<Value> Attribute(std::string_view attr) const override {
    if (attr == "name") return Value::String(name_);
    if (attr == "arguments") {
      std::vector<Value> names;
      for (const auto& p : def_->params) names.push_back(Value::String(p));
      return Value::Tuple(std::move(names));
    }
    if (attr == "catch_kwargs") return Value::Bool(def_->uses_kwargs);
    if (attr == "catch_varargs") return Value::Bool(def_->uses_varargs);
    if (attr == "caller") return Value::Bool(def_->uses_caller);
    return std::nullopt;
  }

 private:
  const Stmt* def_;
  std::string name_;
  std::shared_ptr<Scope> closure_;
};

std::shared_ptr<Scope> Child(const std::shared_ptr<Scope>& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

}  // namespace

absl::Status Renderer::DepthGuard::Check() const {
  if (r_->depth_ <= r_->limits_.max_depth) return absl::OkStatus();
  return RenderError(absl::StrCat("maximum recursion depth exceeded"));
}

Renderer::Renderer(const ChatTemplateLimits& limits,
                   std::optional<std::time_t> now)
    : limits_(limits), now_(now) {}

Renderer::~Renderer() {
  for (auto& weak : closures_) {
    if (auto scope = weak.lock()) scope->vars.clear();
  }
  for (auto& weak : namespaces_) {
    if (auto ns = weak.lock()) ns->attrs.clear();
  }
}

absl::Status Renderer::Render(const Body& body,
                              std::vector<std::pair<std::string, Value>> vars,
                              std::string* out) {
  auto root = std::make_shared<Scope>();
  for (auto& [k, v] : vars) root->Set(k, std::move(v));
  closures_.push_back(root);
  Flow flow = Flow::kNormal;
  return ExecBody(body, root, out, &flow);
}

absl::Status Renderer::Step(int64_t n) {
  steps_ += n;
  if (steps_ <= limits_.max_steps) return absl::OkStatus();
  return RenderError(
      absl::StrCat("chat template exceeded its limit of ", limits_.max_steps,
                   " evaluation steps (an endless or very long loop?)"));
}

absl::Status Renderer::CheckString(size_t bytes) {
  if (bytes <= limits_.max_string_bytes) return absl::OkStatus();
  return TooLarge(bytes, limits_.max_string_bytes);
}

absl::Status Renderer::CheckItems(size_t n) {
  if (n <= limits_.max_items) return absl::OkStatus();
  return RenderError(absl::StrCat("chat template built a collection of ", n,
                                  " items (limit ", limits_.max_items, ")"));
}

absl::StatusOr<Value> Renderer::Checked(Value v) {
  if (v.is_list()) RETURN_IF_ERROR(CheckItems(v.list().items.size()));
  if (v.is_dict()) RETURN_IF_ERROR(CheckItems(v.dict().size()));
  if (NestingDepth(v) > kMaxNesting) {
    return RenderError(
        absl::StrCat("value nested deeper than ", kMaxNesting, " levels"));
  }
  return v;
}

std::shared_ptr<NamespaceData> Renderer::NewNamespace() {
  auto ns = std::make_shared<NamespaceData>();
  namespaces_.push_back(ns);
  return ns;
}

absl::Status Renderer::Append(std::string* out, const Value& v) {
  if (v.is_string()) {
    RETURN_IF_ERROR(CheckString(out->size() + v.str().size()));
    out->append(v.str());
    return Step(static_cast<int64_t>(v.str().size() / 64));
  }
  AppendStr(v, out);
  return CheckString(out->size());
}

absl::Status Renderer::ExecBody(const Body& body,
                                const std::shared_ptr<Scope>& scope,
                                std::string* out, Flow* flow) {
  for (const auto& s : body) {
    RETURN_IF_ERROR(Exec(*s, scope, out, flow));
    if (*flow != Flow::kNormal) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status Renderer::Exec(const Stmt& s, const std::shared_ptr<Scope>& scope,
                            std::string* out, Flow* flow) {
  DepthGuard guard(this);
  RETURN_IF_ERROR(guard.Check());
  RETURN_IF_ERROR(Step());
  switch (s.kind) {
    case StmtKind::kData:
      RETURN_IF_ERROR(CheckString(out->size() + s.text.size()));
      out->append(s.text);
      return absl::OkStatus();
    case StmtKind::kOutput: {
      if (s.expr->constant) {
        // jinja2 renders a constant {{ }} when it compiles the template;
        // where that fails, at run time (the error to report).
        absl::StatusOr<Value> folded = EvalConstant(*s.expr, *scope);
        if (folded.ok()) return Append(out, *folded);
      }
      ASSIGN_OR_RETURN(Value v, Eval(*s.expr, *scope));
      return Append(out, v);
    }
    case StmtKind::kIf: {
      ASSIGN_OR_RETURN(Value test, Eval(*s.expr, *scope));
      return ExecBody(Truthy(test) ? s.body : s.else_body, scope, out, flow);
    }
    case StmtKind::kFor: {
      ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, *scope));
      ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
      return ExecFor(s, std::move(items), 0, scope, out);
    }
    case StmtKind::kSet: {
      ASSIGN_OR_RETURN(Value v, Eval(*s.expr, *scope));
      return ExecSet(s, std::move(v), *scope);
    }
    case StmtKind::kSetBlock: {
      std::string text;
      Flow inner_flow = Flow::kNormal;
      RETURN_IF_ERROR(ExecBody(s.body, Child(scope), &text, &inner_flow));
      ASSIGN_OR_RETURN(Value v,
                       EvalFilterChain(s.expr.get(), *scope,
                                       Value::String(std::move(text))));
      return ExecSet(s, std::move(v), *scope);
    }
    case StmtKind::kMacro: {
      if (closures_.empty() || closures_.back().lock() != scope) {
        closures_.push_back(scope);
      }
      scope->Set(s.name, Value::Callable(std::make_shared<MacroCallable>(
                             &s, s.name, scope)));
      return absl::OkStatus();
    }
    case StmtKind::kCallBlock: {
      if (closures_.empty() || closures_.back().lock() != scope) {
        closures_.push_back(scope);
      }
      const Expr& call = *s.expr;
      ASSIGN_OR_RETURN(Value callee, Eval(*call.operands[0], *scope));
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(call, *scope, &args));
      args.kwargs.emplace_back(
          "caller", Value::Callable(
                        std::make_shared<MacroCallable>(&s, "caller", scope)));
      ASSIGN_OR_RETURN(Value v, Call(callee, args));
      return Append(out, v);
    }
    case StmtKind::kFilterBlock: {
      std::string text;
      Flow inner_flow = Flow::kNormal;
      RETURN_IF_ERROR(ExecBody(s.body, Child(scope), &text, &inner_flow));
      ASSIGN_OR_RETURN(Value v,
                       EvalFilterChain(s.expr.get(), *scope,
                                       Value::String(std::move(text))));
      return Append(out, v);
    }
    case StmtKind::kBreak:
      *flow = Flow::kBreak;
      return absl::OkStatus();
    case StmtKind::kContinue:
      *flow = Flow::kContinue;
      return absl::OkStatus();
    case StmtKind::kWith: {
      std::vector<Value> values;
      for (const auto& v : s.with_values) {
        ASSIGN_OR_RETURN(Value value, Eval(*v, *scope));
        values.push_back(std::move(value));
      }
      auto inner = Child(scope);
      for (size_t i = 0; i < values.size(); ++i) {
        RETURN_IF_ERROR(Assign(s.with_targets[i], values[i], *inner));
      }
      return ExecBody(s.body, inner, out, flow);
    }
    case StmtKind::kScope:
      return ExecBody(s.body, Child(scope), out, flow);
    case StmtKind::kNoLoader:
      return RenderError("no loader for this environment specified");
  }
  return absl::OkStatus();
}

absl::Status Renderer::ExecFor(const Stmt& s, std::vector<Value> items,
                               int depth0, const std::shared_ptr<Scope>& scope,
                               std::string* out) {
  auto loop = std::make_shared<LoopData>();
  if (s.cond) {
    for (const Value& item : items) {
      RETURN_IF_ERROR(Step());
      auto test_scope = Child(scope);
      RETURN_IF_ERROR(Assign(s.target, item, *test_scope));
      ASSIGN_OR_RETURN(Value keep, Eval(*s.cond, *test_scope));
      if (Truthy(keep)) loop->items.push_back(item);
    }
  } else {
    loop->items = std::move(items);
  }
  if (loop->items.empty()) {
    Flow flow = Flow::kNormal;
    return ExecBody(s.else_body, Child(scope), out, &flow);
  }
  loop->depth0 = depth0;
  loop->stmt = &s;
  loop->scope = scope;
  const Value loop_value = Value::Loop(loop);
  std::shared_ptr<Scope> iter_scope;
  for (size_t i = 0; i < loop->items.size(); ++i) {
    RETURN_IF_ERROR(Step());
    loop->index0 = i;
    // Each iteration starts with a fresh scope; reuse the last one's storage
    // unless something (a macro defined in the body) still holds it.
    if (iter_scope != nullptr && iter_scope.use_count() == 1) {
      iter_scope->vars.clear();
    } else {
      iter_scope = Child(scope);
    }
    RETURN_IF_ERROR(Assign(s.target, loop->items[i], *iter_scope));
    iter_scope->Set("loop", loop_value);
    Flow flow = Flow::kNormal;
    RETURN_IF_ERROR(ExecBody(s.body, iter_scope, out, &flow));
    if (flow == Flow::kBreak) break;
  }
  return absl::OkStatus();
}

absl::Status Renderer::ExecSet(const Stmt& s, Value v, Scope& scope) {
  return Assign(s.target, v, scope);
}

absl::Status Renderer::Assign(const Target& t, const Value& v, Scope& scope) {
  if (t.kind == Target::Kind::kName) {
    scope.Set(t.name, v);
    return absl::OkStatus();
  }
  if (t.kind == Target::Kind::kNsAttr) {
    const Value* ns = scope.Find(t.name);
    if (ns == nullptr || ns->kind() != Kind::kNamespace) {
      return RenderError("cannot assign attribute on non-namespace object");
    }
    if (Value* slot = ns->ns().Find(t.attr)) {
      *slot = v;
    } else {
      ns->ns().attrs.emplace_back(t.attr, v);
    }
    return absl::OkStatus();
  }
  auto iterated = Iterate(v);
  if (!iterated.ok()) {
    return RenderError(
        absl::StrCat("cannot unpack non-iterable ", TypeName(v), " object"));
  }
  std::vector<Value> items = *std::move(iterated);
  if (items.size() < t.items.size()) {
    return RenderError(absl::StrCat("not enough values to unpack (expected ",
                                    t.items.size(), ", got ", items.size(),
                                    ")"));
  }
  if (items.size() > t.items.size()) {
    return RenderError(absl::StrCat("too many values to unpack (expected ",
                                    t.items.size(), ")"));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    RETURN_IF_ERROR(Assign(t.items[i], items[i], scope));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Renderer::CallMacro(const Stmt& def,
                                          const std::string& name,
                                          const std::shared_ptr<Scope>& closure,
                                          CallArgs& args) {
  DepthGuard guard(this);
  RETURN_IF_ERROR(guard.Check());
  const size_t argc = def.params.size();
  std::vector<std::optional<Value>> values;
  auto kwargs = args.kwargs;
  auto pop_kwarg = [&kwargs](std::string_view key) -> std::optional<Value> {
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
      if (it->first == key) {
        Value v = std::move(it->second);
        kwargs.erase(it);
        return v;
      }
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < argc && i < args.args.size(); ++i) {
    values.push_back(args.args[i]);
  }
  bool found_caller = false;
  if (values.size() != argc) {
    for (size_t i = values.size(); i < argc; ++i) {
      values.push_back(pop_kwarg(def.params[i]));
      if (def.params[i] == "caller") found_caller = true;
    }
  } else {
    found_caller = def.explicit_caller;
  }
  std::optional<Value> caller;
  if (def.uses_caller && !found_caller) {
    caller = pop_kwarg("caller");
    if (!caller) {
      auto info = std::make_shared<UndefinedInfo>();
      info->name = "caller";
      info->hint = "No caller defined";
      caller = Value::Undefined(std::move(info));
    }
  }
  std::string quoted;
  AppendStrRepr(name, &quoted);
  Value kwargs_value;
  if (def.uses_kwargs) {
    auto dict = std::make_shared<DictData>();
    for (auto& [k, v] : kwargs) dict->Set(Value::String(k), v);
    kwargs_value = Value::Dict(std::move(dict));
  } else if (!kwargs.empty()) {
    for (const auto& [k, v] : kwargs) {
      if (k == "caller") {
        return RenderError(absl::StrCat(
            "macro ", quoted,
            " was invoked with two values for the special caller argument. "
            "This is most likely a bug."));
      }
    }
    std::string key;
    AppendStrRepr(kwargs.front().first, &key);
    return RenderError(
        absl::StrCat("macro ", quoted, " takes no keyword argument ", key));
  }
  Value varargs_value;
  if (def.uses_varargs) {
    std::vector<Value> extra;
    for (size_t i = argc; i < args.args.size(); ++i)
      extra.push_back(args.args[i]);
    varargs_value = Value::Tuple(std::move(extra));
  } else if (args.args.size() > argc) {
    return RenderError(absl::StrCat("macro ", quoted, " takes not more than ",
                                    argc, " argument(s)"));
  }
  auto scope = Child(closure);
  const size_t first_default = argc - def.defaults.size();
  for (size_t i = 0; i < argc; ++i) {
    if (values[i]) {
      scope->Set(def.params[i], *values[i]);
    } else if (i >= first_default) {
      ASSIGN_OR_RETURN(Value v, Eval(*def.defaults[i - first_default], *scope));
      scope->Set(def.params[i], std::move(v));
    } else {
      auto info = std::make_shared<UndefinedInfo>();
      info->name = def.params[i];
      info->hint =
          absl::StrCat("parameter '", def.params[i], "' was not provided");
      scope->Set(def.params[i], Value::Undefined(std::move(info)));
    }
  }
  if (caller) scope->Set("caller", *caller);
  if (def.uses_kwargs) scope->Set("kwargs", kwargs_value);
  if (def.uses_varargs) scope->Set("varargs", varargs_value);
  std::string text;
  Flow flow = Flow::kNormal;
  RETURN_IF_ERROR(ExecBody(def.body, scope, &text, &flow));
  return Value::String(std::move(text));
}

absl::StatusOr<Value> Renderer::CallLoop(LoopData& loop, CallArgs& args) {
  if (!loop.stmt->recursive) {
    return RenderError(
        "The loop must have the 'recursive' marker to be called recursively.");
  }
  if (args.args.size() != 1 || !args.kwargs.empty()) {
    return RenderError("loop() takes exactly one argument");
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(args.args[0]));
  std::string text;
  RETURN_IF_ERROR(
      ExecFor(*loop.stmt, items, loop.depth0 + 1, loop.scope, &text));
  return Value::String(std::move(text));
}

absl::StatusOr<Value> Renderer::LoopAttr(const Value& loop_value,
                                         std::string_view name) {
  const LoopData& loop = loop_value.loop();
  const int64_t index0 = static_cast<int64_t>(loop.index0);
  const int64_t length = static_cast<int64_t>(loop.items.size());
  if (name == "index") return Value::Int(index0 + 1);
  if (name == "index0") return Value::Int(index0);
  if (name == "revindex") return Value::Int(length - index0);
  if (name == "revindex0") return Value::Int(length - index0 - 1);
  if (name == "first") return Value::Bool(index0 == 0);
  if (name == "last") return Value::Bool(index0 == length - 1);
  if (name == "length") return Value::Int(length);
  if (name == "depth") return Value::Int(loop.depth0 + 1);
  if (name == "depth0") return Value::Int(loop.depth0);
  if (name == "previtem" || name == "nextitem") {
    const bool prev = name == "previtem";
    const int64_t i = prev ? index0 - 1 : index0 + 1;
    if (i >= 0 && i < length) return loop.items[i];
    auto info = std::make_shared<UndefinedInfo>();
    info->name = std::string(name);
    info->hint = prev ? "there is no previous item" : "there is no next item";
    return Value::Undefined(std::move(info));
  }
  if (name == "cycle" || name == "changed") {
    return Value::Callable(
        std::make_shared<BoundMethod>(loop_value, std::string(name)));
  }
  auto info = std::make_shared<UndefinedInfo>();
  info->name = std::string(name);
  info->has_obj = true;
  info->obj_type = ObjectTypeRepr(loop_value);
  return Value::Undefined(std::move(info));
}

absl::StatusOr<Value> BoundMethod::Call(Renderer& r, CallArgs& args) const {
  if (self_.kind() != Kind::kLoop) return CallMethod(r, self_, name_, args);
  LoopData& loop = self_.loop();
  if (name_ == "cycle") {
    if (args.args.empty()) return RenderError("no items for cycling given");
    return args.args[loop.index0 % args.args.size()];
  }
  Value current = Value::Tuple(args.args);  // changed(*values)
  if (loop.last_changed && Equals(*loop.last_changed, current)) {
    return Value::Bool(false);
  }
  loop.last_changed = current;
  return Value::Bool(true);
}

}  // namespace pdserve::jinja
