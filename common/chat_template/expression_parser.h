// Jinja2 expressions (jinja2.parser's expression grammar and precedence:
// conditional, or, and, not, comparisons, + -, ~, * / // %, **, unary,
// filters/tests/calls, subscripts, literals). The statement parser
// (parser.cc) builds on it. One per parse; not thread-safe.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_EXPRESSION_PARSER_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_EXPRESSION_PARSER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chat_template/ast.h"
#include "common/chat_template/token_stream.h"

namespace pdserve::jinja {

// Sets Expr::constant on every expression of `body` that jinja2 can
// evaluate when it compiles the template (Node.as_const): literals and what
// is built from literals by operators, subscripts, attributes, tests and
// filters other than those taking the render context (map, select, reject,
// selectattr, rejectattr, random). No names, no calls. jinja2 folds such an
// expression into its value where that value has a safe repr, and renders a
// constant {{ }} whatever its value; evaluated so, a slice of what cannot be
// sliced is Undefined (Environment.getitem), where at run time it is a
// TypeError (Renderer::Eval).
void MarkConstantExpressions(Body& body);

// Parses expressions from the token stream (base of the statement parser).
// One per parse; not thread-safe.
class ExpressionParser : public TokenStream {
 public:
  using TokenStream::TokenStream;

 protected:
  // parse_tuple: a comma list (a tuple) or one expression.
  absl::StatusOr<ExprPtr> ParseTuple(bool simplified, bool with_condexpr,
                                     bool explicit_parentheses);
  bool IsTupleEnd() const;
  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr);
  absl::StatusOr<ExprPtr> ParsePrimary();
  // `|name(args)` chains; start_inline for {% filter name %}.
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr node, bool start_inline);
  absl::Status ParseCallArgs(Expr* e);

 private:
  ExprPtr NewExpr(ExprKind kind, int line);
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  ExprPtr Binary(ExprKind kind, ExprPtr a, ExprPtr b, int line);
  ExprPtr Arith(BinOp op, ExprPtr a, ExprPtr b, int line);
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscribed();
  absl::StatusOr<ExprPtr> ParseCall(ExprPtr node);
  absl::StatusOr<std::string> ParseDottedName();
  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node);
};

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_EXPRESSION_PARSER_H_
