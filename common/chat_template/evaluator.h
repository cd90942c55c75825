// The evaluator: renders a parsed template with Jinja2's runtime semantics
// (scoping, loops, macros and call blocks, jinja2's default Undefined, the
// ImmutableSandboxedEnvironment's attribute rules). One Renderer renders one
// template once, on one thread; all per-render state (scopes, namespaces,
// step counters) lives in it, so concurrent renders share only the immutable
// syntax tree.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_EVALUATOR_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_EVALUATOR_H_

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chat_template/ast.h"
#include "common/chat_template/limits.h"
#include "common/chat_template/value.h"

namespace pdserve::jinja {

// Arguments of a call, a filter or a test (after the filtered value). A plain
// value type.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// A variable scope; lookups walk to the parent (the enclosing block, or the
// definition site of a macro). Mutable; confined to one render.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* Find(std::string_view name) const;
  void Set(std::string_view name, Value v);
};

// State of a running {% for %} (the `loop` variable). Mutable; confined to
// one render.
struct LoopData {
  std::vector<Value> items;
  size_t index0 = 0;
  int depth0 = 0;
  const Stmt* stmt = nullptr;    // for recursive loop(...) calls
  std::shared_ptr<Scope> scope;  // the scope the loop runs in
  std::optional<Value> last_changed;
};

// A builtin global function (range, namespace, raise_exception, ...).
// Stateless and immutable: one instance serves every render.
class BuiltinFunction : public Callable {
 public:
  using Fn = absl::StatusOr<Value> (*)(Renderer& r, CallArgs& args);
  BuiltinFunction(std::string name, Fn fn) : name_(std::move(name)), fn_(fn) {}
  absl::StatusOr<Value> Call(Renderer& r, CallArgs& args) const override {
    return fn_(r, args);
  }
  std::string Repr() const override;
  std::string TypeName() const override { return "function"; }

 private:
  std::string name_;
  Fn fn_;
};

// A method bound to its receiver ("abc".upper, d.items, loop.cycle).
// Created during a render and used on its thread.
class BoundMethod : public Callable {
 public:
  BoundMethod(Value self, std::string name)
      : self_(std::move(self)), name_(std::move(name)) {}
  absl::StatusOr<Value> Call(Renderer& r, CallArgs& args) const override;
  std::string Repr() const override;
  std::string TypeName() const override { return "builtin_function_or_method"; }

 private:
  Value self_;
  std::string name_;
};

enum class Flow { kNormal, kBreak, kContinue };

// Renders one template once (see the file comment). Not thread-safe: one
// Renderer per render; the syntax tree it walks is shared read-only.
class Renderer {
 public:
  Renderer(const ChatTemplateLimits& limits, std::optional<std::time_t> now);
  ~Renderer();  // clears closures and namespaces (breaks reference cycles)
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  // Renders `body` with `vars` as the template's variables.
  absl::Status Render(const Body& body,
                      std::vector<std::pair<std::string, Value>> vars,
                      std::string* out);

  // Operations the builtins share.
  absl::StatusOr<Value> Call(const Value& callee, CallArgs& args);
  // jinja2 sandbox getattr (attribute, then item) and getitem (item, then
  // attribute); a missing one is an Undefined naming the owner.
  absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name);
  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
  // Python iter(): the items of a list, a dict's keys, a string's characters;
  // consumes a generator; TypeError for non-iterables.
  absl::StatusOr<std::vector<Value>> Iterate(const Value& v);
  absl::StatusOr<Value> Filter(std::string_view name, const Value& input,
                               CallArgs& args);
  absl::StatusOr<bool> Test(std::string_view name, const Value& v,
                            CallArgs& args);

  // Limits: each returns INVALID_ARGUMENT once exceeded.
  absl::Status Step(int64_t n = 1);
  absl::Status CheckString(size_t bytes);
  absl::Status CheckItems(size_t n);
  // A container built by the template: checks size and nesting.
  absl::StatusOr<Value> Checked(Value v);
  const ChatTemplateLimits& limits() const { return limits_; }
  std::optional<std::time_t> now() const { return now_; }

  std::shared_ptr<NamespaceData> NewNamespace();
  absl::StatusOr<Value> CallMacro(const Stmt& def, const std::string& name,
                                  const std::shared_ptr<Scope>& closure,
                                  CallArgs& args);
  absl::StatusOr<Value> CallLoop(LoopData& loop, CallArgs& args);

 private:
  // Counts one nesting level for its lifetime; Check() fails past the limit.
  class DepthGuard {
   public:
    explicit DepthGuard(Renderer* r) : r_(r) { ++r_->depth_; }
    ~DepthGuard() { --r_->depth_; }
    absl::Status Check() const;

   private:
    Renderer* r_;
  };

  absl::Status ExecBody(const Body& body, const std::shared_ptr<Scope>& scope,
                        std::string* out, Flow* flow);
  absl::Status Exec(const Stmt& s, const std::shared_ptr<Scope>& scope,
                    std::string* out, Flow* flow);
  absl::Status ExecFor(const Stmt& s, std::vector<Value> items, int depth0,
                       const std::shared_ptr<Scope>& scope, std::string* out);
  absl::Status ExecSet(const Stmt& s, Value v, Scope& scope);
  absl::Status Assign(const Target& t, const Value& v, Scope& scope);
  absl::Status Append(std::string* out, const Value& v);

  absl::StatusOr<Value> Eval(const Expr& e, Scope& scope);
  absl::StatusOr<Value> EvalInner(const Expr& e, Scope& scope);
  // A constant expression as jinja2 evaluates it when compiling (slices
  // lenient).
  absl::StatusOr<Value> EvalConstant(const Expr& e, Scope& scope);
  // The branch a conditional, `and` or `or` takes; while evaluating a
  // constant, an error unless the branch is constant too.
  absl::StatusOr<Value> EvalBranch(const Expr* e, Scope& scope);
  absl::Status EvalArgs(const Expr& e, Scope& scope, CallArgs* args);
  absl::StatusOr<Value> EvalFilterChain(const Expr* e, Scope& scope,
                                        const Value& input);
  absl::StatusOr<Value> EvalCompare(const Expr& e, Scope& scope);
  absl::StatusOr<Value> EvalSlice(const Value& obj, const Expr& slice,
                                  Scope& scope);
  Value Lookup(std::string_view name, const Scope& scope) const;
  absl::StatusOr<Value> LoopAttr(const Value& loop, std::string_view name);

  ChatTemplateLimits limits_;
  std::optional<std::time_t> now_;
  int depth_ = 0;
  int64_t steps_ = 0;
  // While a constant expression is evaluated as jinja2 does when compiling:
  // a slice that fails is Undefined (Environment.getitem), not a TypeError.
  bool lenient_slices_ = false;
  std::vector<std::weak_ptr<Scope>> closures_;
  std::vector<std::weak_ptr<NamespaceData>> namespaces_;
};

// Error helpers: every render error is INVALID_ARGUMENT with the message.
absl::Status RenderError(std::string message);
absl::Status UndefinedError(const Value& undefined);

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_EVALUATOR_H_
