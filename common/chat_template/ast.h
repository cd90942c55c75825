// The syntax tree the parser builds and the evaluator walks: expressions and
// statements of the Jinja2 subset chat templates use. Immutable after
// parsing, so one tree serves any number of concurrent renders.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_AST_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_AST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/chat_template/value.h"

namespace pdserve::jinja {

enum class ExprKind : uint8_t {
  kConst,    // value
  kName,     // name
  kGetAttr,  // operands[0].name
  kGetItem,  // operands[0][operands[1]]
  kSlice,    // start:stop:step in operands[0..2] (each may be null)
  kCall,     // operands[0](args, kwargs, *dyn_args, **dyn_kwargs)
  kFilter,   // operands[0] | name(args...); operands[0] null in filter blocks
  kTest,     // operands[0] is name(args...)
  kNeg,      // -operands[0]
  kPos,      // +operands[0]
  kNot,      // not operands[0]
  kBinary,   // operands[0] op operands[1]
  kAnd,
  kOr,
  kConcat,    // operands joined with ~
  kCompare,   // operands[0] cmp_ops[0] operands[1] cmp_ops[1] ...
  kCondExpr,  // operands[1] if operands[0] else operands[2] (may be null)
  kList,
  kTuple,
  kDict,  // operands: key0, value0, key1, value1, ...
};

enum class BinOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// An expression node; which fields are used depends on `kind` (see
// ExprKind). Immutable after parsing.
struct Expr {
  ExprKind kind = ExprKind::kConst;
  int line = 0;
  Value value;
  std::string name;
  BinOp op = BinOp::kAdd;
  std::vector<CmpOp> cmp_ops;
  std::vector<ExprPtr> operands;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args;
  ExprPtr dyn_kwargs;
  bool known = true;  // kFilter/kTest: the name exists
  // jinja2 can evaluate it when it compiles the template (Node.as_const; see
  // MarkConstantExpressions). Set once the template is parsed.
  bool constant = false;
};

// An assignment target: a name, a tuple of targets, or namespace.attr.
struct Target {
  enum class Kind : uint8_t { kName, kTuple, kNsAttr };
  Kind kind = Kind::kName;
  std::string name;
  std::string attr;
  std::vector<Target> items;
};

enum class StmtKind : uint8_t {
  kData,         // text
  kOutput,       // {{ expr }}
  kIf,           // if expr: body else else_body (elif nests in else_body)
  kFor,          // for target in expr [if cond] [recursive]: body else ...
  kSet,          // target = expr
  kSetBlock,     // {% set target [| filter] %}body{% endset %}
  kMacro,        // macro name(params=defaults): body
  kCallBlock,    // {% call(params) expr %}body{% endcall %}
  kFilterBlock,  // {% filter expr %}body{% endfilter %}
  kBreak,
  kContinue,
  kWith,      // with targets = values: body
  kScope,     // {% block %} and {% generation %}: body, rendered in place
  kNoLoader,  // include / import / from / extends: chat templates have no
              // loader
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// A statement node; which fields are used depends on `kind`. Immutable after
// parsing.
struct Stmt {
  StmtKind kind = StmtKind::kData;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  Target target;
  Body body;
  Body else_body;
  bool recursive = false;
  // Macros and call blocks.
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  bool uses_caller = false;
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool explicit_caller = false;
  // with
  std::vector<Target> with_targets;
  std::vector<ExprPtr> with_values;
};

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_AST_H_
