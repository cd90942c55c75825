#include "common/chat_template/expression_parser.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {

ExprPtr ExpressionParser::NewExpr(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

// jinja2's is_tuple_end. Its extra end rules never match (jinja2 passes
// them to Token.test_any as one argument), so only these tokens end a tuple:
// `{% for a, in x %}` takes `in` as a second target, as jinja2 does.
bool ExpressionParser::IsTupleEnd() const {
  const Token& t = Cur();
  return t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd ||
         IsOp(t, ")");
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseTuple(
    bool simplified, bool with_condexpr, bool explicit_parentheses) {
  const int line = Cur().line;
  std::vector<ExprPtr> args;
  bool is_tuple = false;
  while (true) {
    if (!args.empty()) RETURN_IF_ERROR(ExpectOp(","));
    if (IsTupleEnd()) break;
    ExprPtr e;
    if (simplified) {
      ASSIGN_OR_RETURN(e, ParsePrimary());
    } else {
      ASSIGN_OR_RETURN(e, ParseExpression(with_condexpr));
    }
    args.push_back(std::move(e));
    if (IsOp(Cur(), ",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parentheses) {
      return Fail(absl::StrCat("Expected an expression, got '",
                               DescribeToken(Cur()), "'"));
    }
  }
  auto t = NewExpr(ExprKind::kTuple, line);
  t->operands = std::move(args);
  return t;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseExpression(bool with_condexpr) {
  Nest nest(this);
  if (nest.too_deep()) return TooDeep();
  if (!with_condexpr) return ParseOr();
  ASSIGN_OR_RETURN(ExprPtr expr1, ParseOr());
  while (IsName(Cur(), "if")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr expr2, ParseOr());
    ExprPtr expr3;
    if (SkipName("else")) {
      ASSIGN_OR_RETURN(expr3, ParseExpression(true));
    }
    auto c = NewExpr(ExprKind::kCondExpr, line);
    c->operands.push_back(std::move(expr2));
    c->operands.push_back(std::move(expr1));
    c->operands.push_back(std::move(expr3));
    expr1 = std::move(c);
  }
  return expr1;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseOr() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
  while (IsName(Cur(), "or")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
    left = Binary(ExprKind::kOr, std::move(left), std::move(right), line);
  }
  return left;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseAnd() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
  while (IsName(Cur(), "and")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
    left = Binary(ExprKind::kAnd, std::move(left), std::move(right), line);
  }
  return left;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseNot() {
  if (IsName(Cur(), "not")) {
    Nest nest(this);
    if (nest.too_deep()) return TooDeep();
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    auto e = NewExpr(ExprKind::kNot, line);
    e->operands.push_back(std::move(operand));
    return e;
  }
  return ParseCompare();
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseCompare() {
  const int line = Cur().line;
  ASSIGN_OR_RETURN(ExprPtr expr, ParseMath1());
  std::vector<ExprPtr> operands;
  std::vector<CmpOp> ops;
  while (true) {
    const Token& t = Cur();
    CmpOp op;
    if (IsOp(t, "==")) {
      op = CmpOp::kEq;
    } else if (IsOp(t, "!=")) {
      op = CmpOp::kNe;
    } else if (IsOp(t, "<")) {
      op = CmpOp::kLt;
    } else if (IsOp(t, "<=")) {
      op = CmpOp::kLe;
    } else if (IsOp(t, ">")) {
      op = CmpOp::kGt;
    } else if (IsOp(t, ">=")) {
      op = CmpOp::kGe;
    } else if (IsName(t, "in")) {
      op = CmpOp::kIn;
    } else if (IsName(t, "not") && IsName(Look(), "in")) {
      Next();
      op = CmpOp::kNotIn;
    } else {
      break;
    }
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
    ops.push_back(op);
    operands.push_back(std::move(right));
  }
  if (ops.empty()) return expr;
  auto c = NewExpr(ExprKind::kCompare, line);
  c->operands.push_back(std::move(expr));
  for (auto& o : operands) c->operands.push_back(std::move(o));
  c->cmp_ops = std::move(ops);
  return c;
}

ExprPtr ExpressionParser::Binary(ExprKind kind, ExprPtr a, ExprPtr b,
                                 int line) {
  auto e = NewExpr(kind, line);
  e->operands.push_back(std::move(a));
  e->operands.push_back(std::move(b));
  return e;
}
ExprPtr ExpressionParser::Arith(BinOp op, ExprPtr a, ExprPtr b, int line) {
  auto e = Binary(ExprKind::kBinary, std::move(a), std::move(b), line);
  e->op = op;
  return e;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseMath1() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
  while (IsOp(Cur(), "+") || IsOp(Cur(), "-")) {
    const BinOp op = IsOp(Cur(), "+") ? BinOp::kAdd : BinOp::kSub;
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
    left = Arith(op, std::move(left), std::move(right), line);
  }
  return left;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseConcat() {
  const int line = Cur().line;
  ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
  if (!IsOp(Cur(), "~")) return first;
  auto c = NewExpr(ExprKind::kConcat, line);
  c->operands.push_back(std::move(first));
  while (SkipOp("~")) {
    ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
    c->operands.push_back(std::move(next));
  }
  return c;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseMath2() {
  ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
  while (true) {
    BinOp op;
    if (IsOp(Cur(), "*")) {
      op = BinOp::kMul;
    } else if (IsOp(Cur(), "/")) {
      op = BinOp::kDiv;
    } else if (IsOp(Cur(), "//")) {
      op = BinOp::kFloorDiv;
    } else if (IsOp(Cur(), "%")) {
      op = BinOp::kMod;
    } else {
      break;
    }
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
    left = Arith(op, std::move(left), std::move(right), line);
  }
  return left;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParsePow() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
  while (IsOp(Cur(), "**")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
    left = Arith(BinOp::kPow, std::move(left), std::move(right), line);
  }
  return left;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseUnary(bool with_filter) {
  Nest nest(this);
  if (nest.too_deep()) return TooDeep();
  const int line = Cur().line;
  ExprPtr node;
  if (IsOp(Cur(), "-") || IsOp(Cur(), "+")) {
    const ExprKind kind = IsOp(Cur(), "-") ? ExprKind::kNeg : ExprKind::kPos;
    Next();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    node = NewExpr(kind, line);
    node->operands.push_back(std::move(operand));
  } else {
    ASSIGN_OR_RETURN(node, ParsePrimary());
  }
  ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
  if (with_filter) {
    ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
  }
  return node;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParsePrimary() {
  Nest nest(this);
  if (nest.too_deep()) return TooDeep();
  const Token& t = Cur();
  const int line = t.line;
  if (t.type == TokenType::kName) {
    ExprPtr e;
    if (t.value == "true" || t.value == "True") {
      e = NewExpr(ExprKind::kConst, line);
      e->value = Value::Bool(true);
    } else if (t.value == "false" || t.value == "False") {
      e = NewExpr(ExprKind::kConst, line);
      e->value = Value::Bool(false);
    } else if (t.value == "none" || t.value == "None") {
      e = NewExpr(ExprKind::kConst, line);
      e->value = Value::None();
    } else {
      e = NewExpr(ExprKind::kName, line);
      e->name = t.value;
    }
    Next();
    return e;
  }
  if (t.type == TokenType::kString) {
    std::string buf = t.value;
    Next();
    while (Cur().type == TokenType::kString) {
      buf += Cur().value;
      Next();
    }
    auto e = NewExpr(ExprKind::kConst, line);
    e->value = Value::String(std::move(buf));
    return e;
  }
  if (t.type == TokenType::kInteger || t.type == TokenType::kFloat) {
    auto e = NewExpr(ExprKind::kConst, line);
    e->value = t.type == TokenType::kInteger ? Value::Int(t.int_value)
                                             : Value::Float(t.float_value);
    Next();
    return e;
  }
  if (IsOp(t, "(")) {
    Next();
    ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, true));
    RETURN_IF_ERROR(ExpectOp(")"));
    return e;
  }
  if (IsOp(t, "[")) {
    Next();
    auto e = NewExpr(ExprKind::kList, line);
    while (!IsOp(Cur(), "]")) {
      if (!e->operands.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(Cur(), "]")) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      e->operands.push_back(std::move(item));
    }
    RETURN_IF_ERROR(ExpectOp("]"));
    return e;
  }
  if (IsOp(t, "{")) {
    Next();
    auto e = NewExpr(ExprKind::kDict, line);
    while (!IsOp(Cur(), "}")) {
      if (!e->operands.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(Cur(), "}")) break;
      ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
      RETURN_IF_ERROR(ExpectOp(":"));
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      e->operands.push_back(std::move(key));
      e->operands.push_back(std::move(value));
    }
    RETURN_IF_ERROR(ExpectOp("}"));
    return e;
  }
  return Fail(absl::StrCat("unexpected '", DescribeToken(t), "'"));
}

absl::StatusOr<ExprPtr> ExpressionParser::ParsePostfix(ExprPtr node) {
  while (true) {
    if (IsOp(Cur(), ".") || IsOp(Cur(), "[")) {
      ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
    } else if (IsOp(Cur(), "(")) {
      ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    if (IsOp(Cur(), "|")) {
      ASSIGN_OR_RETURN(node, ParseFilter(std::move(node), false));
    } else if (IsName(Cur(), "is")) {
      ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
    } else if (IsOp(Cur(), "(")) {
      ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseSubscript(ExprPtr node) {
  const Token t = Cur();
  Next();
  if (IsOp(t, ".")) {
    const Token attr = Cur();
    Next();
    if (attr.type == TokenType::kName) {
      auto e = NewExpr(ExprKind::kGetAttr, t.line);
      e->name = attr.value;
      e->operands.push_back(std::move(node));
      return e;
    }
    if (attr.type != TokenType::kInteger) {
      return Fail("expected name or number", attr.line);
    }
    auto key = NewExpr(ExprKind::kConst, attr.line);
    key->value = Value::Int(attr.int_value);
    auto e = NewExpr(ExprKind::kGetItem, t.line);
    e->operands.push_back(std::move(node));
    e->operands.push_back(std::move(key));
    return e;
  }
  std::vector<ExprPtr> args;
  while (!IsOp(Cur(), "]")) {
    if (!args.empty()) RETURN_IF_ERROR(ExpectOp(","));
    ASSIGN_OR_RETURN(ExprPtr arg, ParseSubscribed());
    args.push_back(std::move(arg));
  }
  RETURN_IF_ERROR(ExpectOp("]"));
  ExprPtr key;
  if (args.size() == 1) {
    key = std::move(args[0]);
  } else {
    key = NewExpr(ExprKind::kTuple, t.line);
    key->operands = std::move(args);
  }
  auto e = NewExpr(ExprKind::kGetItem, t.line);
  e->operands.push_back(std::move(node));
  e->operands.push_back(std::move(key));
  return e;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseSubscribed() {
  const int line = Cur().line;
  std::vector<ExprPtr> args;
  if (IsOp(Cur(), ":")) {
    Next();
    args.push_back(nullptr);
  } else {
    ASSIGN_OR_RETURN(ExprPtr node, ParseExpression(true));
    if (!IsOp(Cur(), ":")) return node;
    Next();
    args.push_back(std::move(node));
  }
  if (IsOp(Cur(), ":")) {
    args.push_back(nullptr);
  } else if (!IsOp(Cur(), "]") && !IsOp(Cur(), ",")) {
    ASSIGN_OR_RETURN(ExprPtr stop, ParseExpression(true));
    args.push_back(std::move(stop));
  } else {
    args.push_back(nullptr);
  }
  if (IsOp(Cur(), ":")) {
    Next();
    if (!IsOp(Cur(), "]") && !IsOp(Cur(), ",")) {
      ASSIGN_OR_RETURN(ExprPtr step, ParseExpression(true));
      args.push_back(std::move(step));
    } else {
      args.push_back(nullptr);
    }
  } else {
    args.push_back(nullptr);
  }
  auto e = NewExpr(ExprKind::kSlice, line);
  e->operands = std::move(args);
  return e;
}

absl::Status ExpressionParser::ParseCallArgs(Expr* e) {
  RETURN_IF_ERROR(ExpectOp("("));
  bool require_comma = false;
  auto ensure = [this](bool ok) {
    return ok ? absl::OkStatus() : Fail("Invalid argument syntax");
  };
  while (!IsOp(Cur(), ")")) {
    if (require_comma) {
      RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(Cur(), ")")) break;
    }
    if (IsOp(Cur(), "*")) {
      RETURN_IF_ERROR(ensure(!e->dyn_args && !e->dyn_kwargs));
      Next();
      ASSIGN_OR_RETURN(e->dyn_args, ParseExpression(true));
    } else if (IsOp(Cur(), "**")) {
      RETURN_IF_ERROR(ensure(!e->dyn_kwargs));
      Next();
      ASSIGN_OR_RETURN(e->dyn_kwargs, ParseExpression(true));
    } else if (Cur().type == TokenType::kName && IsOp(Look(), "=")) {
      RETURN_IF_ERROR(ensure(!e->dyn_kwargs));
      std::string key = Cur().value;
      Next();
      Next();
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      e->kwargs.emplace_back(std::move(key), std::move(value));
    } else {
      RETURN_IF_ERROR(
          ensure(!e->dyn_args && !e->dyn_kwargs && e->kwargs.empty()));
      ASSIGN_OR_RETURN(ExprPtr arg, ParseExpression(true));
      e->args.push_back(std::move(arg));
    }
    require_comma = true;
  }
  return ExpectOp(")");
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseCall(ExprPtr node) {
  auto e = NewExpr(ExprKind::kCall, Cur().line);
  e->operands.push_back(std::move(node));
  RETURN_IF_ERROR(ParseCallArgs(e.get()));
  return e;
}

absl::StatusOr<std::string> ExpressionParser::ParseDottedName() {
  ASSIGN_OR_RETURN(std::string name, ExpectName());
  while (SkipOp(".")) {
    ASSIGN_OR_RETURN(std::string part, ExpectName());
    absl::StrAppend(&name, ".", part);
  }
  return name;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseFilter(ExprPtr node,
                                                      bool start_inline) {
  while (IsOp(Cur(), "|") || start_inline) {
    if (!start_inline) Next();
    start_inline = false;
    auto e = NewExpr(ExprKind::kFilter, Cur().line);
    ASSIGN_OR_RETURN(e->name, ParseDottedName());
    e->known = IsKnownFilter(e->name);
    if (IsOp(Cur(), "(")) RETURN_IF_ERROR(ParseCallArgs(e.get()));
    e->operands.push_back(std::move(node));
    node = std::move(e);
  }
  return node;
}

absl::StatusOr<ExprPtr> ExpressionParser::ParseTest(ExprPtr node) {
  const int line = Cur().line;
  Next();  // "is"
  const bool negated = SkipName("not");
  auto e = NewExpr(ExprKind::kTest, line);
  ASSIGN_OR_RETURN(e->name, ParseDottedName());
  e->known = IsKnownTest(e->name);
  e->operands.push_back(std::move(node));
  const Token& t = Cur();
  if (IsOp(t, "(")) {
    RETURN_IF_ERROR(ParseCallArgs(e.get()));
  } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
              t.type == TokenType::kInteger || t.type == TokenType::kFloat ||
              IsOp(t, "(") || IsOp(t, "[") || IsOp(t, "{")) &&
             !IsName(t, "else") && !IsName(t, "or") && !IsName(t, "and")) {
    if (IsName(t, "is")) return Fail("You cannot chain multiple tests with is");
    ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
    ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
    e->args.push_back(std::move(arg));
  }
  if (!negated) return e;
  auto n = NewExpr(ExprKind::kNot, line);
  n->operands.push_back(std::move(e));
  return n;
}

namespace {

bool MarkConstant(Expr* e) {
  if (e == nullptr) return true;
  bool constant = e->kind != ExprKind::kName && e->kind != ExprKind::kCall;
  if (e->kind == ExprKind::kFilter || e->kind == ExprKind::kTest) {
    if (!e->known || e->operands.empty() || e->operands[0] == nullptr) {
      constant = false;
    }
    for (const char* context_filter :
         {"map", "select", "reject", "selectattr", "rejectattr", "random"}) {
      if (e->kind == ExprKind::kFilter && e->name == context_filter) {
        constant = false;
      }
    }
  }
  // Every child is marked, whatever this node is. A conditional, `and` and
  // `or` need only their first operand constant: the branch they take must
  // be too, which the evaluator checks (Renderer::EvalBranch).
  const bool first_decides = e->kind == ExprKind::kCondExpr ||
                             e->kind == ExprKind::kAnd ||
                             e->kind == ExprKind::kOr;
  for (size_t i = 0; i < e->operands.size(); ++i) {
    const bool c = MarkConstant(e->operands[i].get());
    if (i == 0 || !first_decides) constant = c && constant;
  }
  for (ExprPtr& a : e->args) constant = MarkConstant(a.get()) && constant;
  for (auto& [name, a] : e->kwargs) {
    constant = MarkConstant(a.get()) && constant;
  }
  constant = MarkConstant(e->dyn_args.get()) && constant;
  constant = MarkConstant(e->dyn_kwargs.get()) && constant;
  e->constant = constant;
  return constant;
}

}  // namespace

void MarkConstantExpressions(Body& body) {
  for (StmtPtr& s : body) {
    MarkConstant(s->expr.get());
    MarkConstant(s->cond.get());
    for (ExprPtr& d : s->defaults) MarkConstant(d.get());
    for (ExprPtr& v : s->with_values) MarkConstant(v.get());
    MarkConstantExpressions(s->body);
    MarkConstantExpressions(s->else_body);
  }
}

}  // namespace pdserve::jinja
