#include "common/chat_template/parser.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/expression_parser.h"
#include "common/chat_template/lexer.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {
namespace {

bool IsConstName(std::string_view n) {
  return n == "true" || n == "false" || n == "none" || n == "True" ||
         n == "False" || n == "None";
}

class Parser : public ExpressionParser {
 public:
  using ExpressionParser::ExpressionParser;

  absl::StatusOr<Body> Run() {
    ASSIGN_OR_RETURN(Body body, Subparse({}));
    return body;
  }

 private:
  // ------------------------------------------------------------ statements

  absl::StatusOr<Body> Subparse(const std::vector<std::string>& end_tokens) {
    Nest nest(this);
    if (nest.too_deep()) return TooDeep();
    if (!end_tokens.empty()) end_token_stack_.push_back(end_tokens);
    Body body;
    while (Cur().type != TokenType::kEof) {
      const Token& t = Cur();
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kData;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        Next();
      } else if (t.type == TokenType::kVariableBegin) {
        const int line = t.line;
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = line;
        ASSIGN_OR_RETURN(s->expr, ParseTuple(false, true, false));
        RETURN_IF_ERROR(
            Expect(TokenType::kVariableEnd, "end of print statement"));
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        Next();
        if (Cur().type == TokenType::kName &&
            std::find(end_tokens.begin(), end_tokens.end(), Cur().value) !=
                end_tokens.end()) {
          if (!end_tokens.empty()) end_token_stack_.pop_back();
          return body;
        }
        RETURN_IF_ERROR(ParseStatement(&body));
        RETURN_IF_ERROR(ExpectBlockEnd());
      } else {
        return Fail(absl::StrCat("unexpected '", DescribeToken(t), "'"));
      }
    }
    if (!end_tokens.empty()) end_token_stack_.pop_back();
    return body;
  }

  absl::Status FailUnknownTag(const std::string* name, int line) const {
    std::vector<std::string> message;
    message.push_back(
        name == nullptr
            ? "Unexpected end of template."
            : absl::StrCat("Encountered unknown tag '", *name, "'."));
    if (!end_token_stack_.empty()) {
      std::vector<std::string> looking;
      for (const auto& t : end_token_stack_.back()) {
        looking.push_back(absl::StrCat("'", t, "'"));
      }
      bool expected = false;
      for (const auto& tokens : end_token_stack_) {
        if (name != nullptr &&
            std::find(tokens.begin(), tokens.end(), *name) != tokens.end()) {
          expected = true;
        }
      }
      if (expected) {
        message.push_back(absl::StrCat(
            "You probably made a nesting mistake. Jinja is expecting this tag, "
            "but currently looking for ",
            absl::StrJoin(looking, " or "), "."));
      } else {
        message.push_back(
            absl::StrCat("Jinja was looking for the following tags: ",
                         absl::StrJoin(looking, " or "), "."));
      }
    }
    if (!tag_stack_.empty()) {
      message.push_back(
          absl::StrCat("The innermost block that needs to be closed is '",
                       tag_stack_.back(), "'."));
    }
    return Fail(absl::StrJoin(message, " "), line);
  }

  absl::StatusOr<Body> ParseStatements(
      const std::vector<std::string>& end_tokens, bool drop_needle) {
    SkipOp(":");
    RETURN_IF_ERROR(ExpectBlockEnd());
    ASSIGN_OR_RETURN(Body body, Subparse(end_tokens));
    if (Cur().type == TokenType::kEof) {
      end_token_stack_.push_back(end_tokens);
      auto status = FailUnknownTag(nullptr, Cur().line);
      end_token_stack_.pop_back();
      return status;
    }
    if (drop_needle) Next();
    return body;
  }

  absl::Status ParseStatement(Body* out) {
    const Token& t = Cur();
    if (t.type != TokenType::kName) return Fail("tag name expected", t.line);
    const std::string tag = t.value;
    const int line = t.line;
    tag_stack_.push_back(tag);
    absl::Status status;
    auto stmt = std::make_unique<Stmt>();
    stmt->line = line;
    if (tag == "for") {
      status = ParseFor(stmt.get());
    } else if (tag == "if") {
      status = ParseIf(stmt.get());
    } else if (tag == "set") {
      status = ParseSet(stmt.get());
    } else if (tag == "macro") {
      status = ParseMacro(stmt.get());
    } else if (tag == "call") {
      status = ParseCallBlock(stmt.get());
    } else if (tag == "filter") {
      status = ParseFilterBlock(stmt.get());
    } else if (tag == "with") {
      status = ParseWith(stmt.get());
    } else if (tag == "block") {
      status = ParseBlock(stmt.get());
    } else if (tag == "generation") {
      Next();
      stmt->kind = StmtKind::kScope;
      auto body = ParseStatements({"endgeneration"}, true);
      if (body.ok()) stmt->body = *std::move(body);
      status = body.status();
    } else if (tag == "print") {
      Next();
      bool first = true;
      while (Cur().type != TokenType::kBlockEnd) {
        if (!first) RETURN_IF_ERROR(ExpectOp(","));
        first = false;
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = line;
        ASSIGN_OR_RETURN(s->expr, ParseExpression(true));
        out->push_back(std::move(s));
      }
      tag_stack_.pop_back();
      return absl::OkStatus();
    } else if (tag == "break" || tag == "continue") {
      Next();
      if (loop_depth_ == 0) {
        return Fail(absl::StrCat("'", tag, "' outside loop"), line);
      }
      stmt->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    } else if (tag == "include" || tag == "import" || tag == "from" ||
               tag == "extends") {
      status = ParseLoaderTag(tag, stmt.get());
    } else {
      tag_stack_.pop_back();
      return FailUnknownTag(&tag, line);
    }
    if (!status.ok()) return status;
    tag_stack_.pop_back();
    out->push_back(std::move(stmt));
    return absl::OkStatus();
  }

  absl::Status ParseFor(Stmt* s) {
    Next();
    s->kind = StmtKind::kFor;
    ASSIGN_OR_RETURN(s->target, ParseAssignTarget(true, false, false));
    if (!SkipName("in")) return ExpectFailure("in");
    ASSIGN_OR_RETURN(s->expr, ParseTuple(false, false, false));
    if (SkipName("if")) {
      ASSIGN_OR_RETURN(s->cond, ParseExpression(true));
    }
    s->recursive = SkipName("recursive");
    ++loop_depth_;
    auto body = ParseStatements({"endfor", "else"}, false);
    --loop_depth_;
    if (!body.ok()) return body.status();
    s->body = *std::move(body);
    const bool is_else = IsName(Cur(), "else");
    Next();
    if (is_else) {
      ASSIGN_OR_RETURN(s->else_body, ParseStatements({"endfor"}, true));
    }
    return absl::OkStatus();
  }

  absl::Status ParseIf(Stmt* s) {
    Next();
    Stmt* node = s;
    while (true) {
      node->kind = StmtKind::kIf;
      ASSIGN_OR_RETURN(node->expr, ParseTuple(false, false, false));
      ASSIGN_OR_RETURN(node->body,
                       ParseStatements({"elif", "else", "endif"}, false));
      const std::string which = Cur().value;
      const int line = Cur().line;
      Next();
      if (which == "elif") {
        auto elif = std::make_unique<Stmt>();
        elif->line = line;
        Stmt* next = elif.get();
        node->else_body.push_back(std::move(elif));
        node = next;
        continue;
      }
      if (which == "else") {
        ASSIGN_OR_RETURN(node->else_body, ParseStatements({"endif"}, true));
      }
      return absl::OkStatus();
    }
  }

  absl::Status ParseSet(Stmt* s) {
    Next();
    ASSIGN_OR_RETURN(s->target, ParseAssignTarget(true, false, true));
    if (SkipOp("=")) {
      s->kind = StmtKind::kSet;
      ASSIGN_OR_RETURN(s->expr, ParseTuple(false, true, false));
      return absl::OkStatus();
    }
    s->kind = StmtKind::kSetBlock;
    ASSIGN_OR_RETURN(s->expr, ParseFilter(nullptr, false));
    ASSIGN_OR_RETURN(s->body, ParseStatements({"endset"}, true));
    return absl::OkStatus();
  }

  absl::Status ParseSignature(Stmt* s) {
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(Cur(), ")")) {
      if (!s->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(Target arg, ParseAssignTarget(false, true, false));
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(ExprPtr def, ParseExpression(true));
        s->defaults.push_back(std::move(def));
      } else if (!s->defaults.empty()) {
        return Fail("non-default argument follows default argument");
      }
      s->params.push_back(arg.name);
    }
    return ExpectOp(")");
  }

  absl::Status ParseMacroBody(Stmt* s, const char* end_tag) {
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    auto body = ParseStatements({end_tag}, true);
    loop_depth_ = saved_loop_depth;
    if (!body.ok()) return body.status();
    s->body = *std::move(body);
    for (size_t i = 0; i < s->params.size(); ++i) {
      if (s->params[i] == "caller") {
        s->explicit_caller = true;
        if (UsesName(s->body, "caller") &&
            i + s->defaults.size() < s->params.size()) {
          return Fail(
              "When defining macros or call blocks the special \"caller\" "
              "argument must be omitted or be given a default.",
              s->line);
        }
      }
    }
    auto declared = [s](const char* n) {
      return std::find(s->params.begin(), s->params.end(), n) !=
             s->params.end();
    };
    s->uses_caller = !declared("caller") && UsesName(s->body, "caller");
    s->uses_varargs = !declared("varargs") && UsesName(s->body, "varargs");
    s->uses_kwargs = !declared("kwargs") && UsesName(s->body, "kwargs");
    return absl::OkStatus();
  }

  absl::Status ParseMacro(Stmt* s) {
    Next();
    s->kind = StmtKind::kMacro;
    ASSIGN_OR_RETURN(Target name, ParseAssignTarget(false, true, false));
    s->name = name.name;
    RETURN_IF_ERROR(ParseSignature(s));
    return ParseMacroBody(s, "endmacro");
  }

  absl::Status ParseCallBlock(Stmt* s) {
    Next();
    s->kind = StmtKind::kCallBlock;
    if (IsOp(Cur(), "(")) RETURN_IF_ERROR(ParseSignature(s));
    ASSIGN_OR_RETURN(s->expr, ParseExpression(true));
    if (s->expr->kind != ExprKind::kCall) return Fail("expected call", s->line);
    return ParseMacroBody(s, "endcall");
  }

  absl::Status ParseFilterBlock(Stmt* s) {
    Next();
    s->kind = StmtKind::kFilterBlock;
    ASSIGN_OR_RETURN(s->expr, ParseFilter(nullptr, true));
    ASSIGN_OR_RETURN(s->body, ParseStatements({"endfilter"}, true));
    return absl::OkStatus();
  }

  absl::Status ParseWith(Stmt* s) {
    Next();
    s->kind = StmtKind::kWith;
    while (Cur().type != TokenType::kBlockEnd) {
      if (!s->with_targets.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(Target t, ParseAssignTarget(true, false, false));
      RETURN_IF_ERROR(ExpectOp("="));
      ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
      s->with_targets.push_back(std::move(t));
      s->with_values.push_back(std::move(v));
    }
    ASSIGN_OR_RETURN(s->body, ParseStatements({"endwith"}, true));
    return absl::OkStatus();
  }

  // {% include %}, {% import %}, {% from %}, {% extends %}: parsed as jinja2
  // parses them; rendering one fails, as there is no template loader.
  absl::Status ParseLoaderTag(const std::string& tag, Stmt* s) {
    Next();
    s->kind = StmtKind::kNoLoader;
    ASSIGN_OR_RETURN(s->expr, ParseExpression(true));
    auto context = [this]() {
      if ((IsName(Cur(), "with") || IsName(Cur(), "without")) &&
          IsName(Look(), "context")) {
        Next();
        Next();
      }
    };
    if (tag == "include") {
      if (IsName(Cur(), "ignore") && IsName(Look(), "missing")) {
        Next();
        Next();
      }
      context();
    } else if (tag == "import") {
      if (!SkipName("as")) return ExpectFailure("as");
      ASSIGN_OR_RETURN(s->name, ExpectName());
      context();
    } else if (tag == "from") {
      if (!SkipName("import")) return ExpectFailure("import");
      while (Cur().type == TokenType::kName || IsOp(Cur(), ",")) {
        if (IsName(Cur(), "with") || IsName(Cur(), "without")) {
          context();
          break;
        }
        Next();
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParseBlock(Stmt* s) {
    Next();
    s->kind = StmtKind::kScope;
    ASSIGN_OR_RETURN(s->name, ExpectName());
    SkipName("scoped");
    SkipName("required");
    if (IsOp(Cur(), "-")) {
      return Fail(
          "Block names in Jinja have to be valid Python identifiers and may "
          "not contain hyphens, use an underscore instead.");
    }
    ASSIGN_OR_RETURN(s->body, ParseStatements({"endblock"}, true));
    SkipName(s->name);
    return absl::OkStatus();
  }

  // -------------------------------------------------------------- targets

  // parse_assign_target: a name, or (with_tuple) a comma list of primaries;
  // with_namespace also allows `ns.attr` items ({% set a, ns.b = ... %}).
  absl::StatusOr<Target> ParseAssignTarget(bool with_tuple, bool name_only,
                                           bool with_namespace) {
    Target target;
    if (name_only) {
      ASSIGN_OR_RETURN(target.name, ExpectName());
      if (IsConstName(target.name)) return Fail("can't assign to 'const'");
      return target;
    }
    if (!with_tuple) return ParseTargetPrimary(with_namespace);
    std::vector<Target> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd()) break;
      ASSIGN_OR_RETURN(Target item, ParseTargetPrimary(with_namespace));
      items.push_back(std::move(item));
      if (!IsOp(Cur(), ",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      return Fail(absl::StrCat("Expected an expression, got '",
                               DescribeToken(Cur()), "'"));
    }
    target.kind = Target::Kind::kTuple;
    target.items = std::move(items);
    return target;
  }

  absl::StatusOr<Target> ParseTargetPrimary(bool with_namespace) {
    if (with_namespace && Cur().type == TokenType::kName &&
        !IsConstName(Cur().value) && IsOp(Look(), ".")) {
      Target target;
      target.kind = Target::Kind::kNsAttr;
      target.name = Cur().value;
      Next();
      Next();
      ASSIGN_OR_RETURN(target.attr, ExpectName());
      return target;
    }
    ASSIGN_OR_RETURN(ExprPtr expr, ParsePrimary());
    return ToTarget(*expr);
  }

  absl::StatusOr<Target> ToTarget(const Expr& e) {
    Target t;
    if (e.kind == ExprKind::kName) {
      t.name = e.name;
      return t;
    }
    if (e.kind == ExprKind::kTuple) {
      t.kind = Target::Kind::kTuple;
      for (const auto& item : e.operands) {
        ASSIGN_OR_RETURN(Target sub, ToTarget(*item));
        t.items.push_back(std::move(sub));
      }
      return t;
    }
    static constexpr const char* kNames[] = {
        "const",  "name",    "getattr",  "getitem", "slice",   "call", "filter",
        "test",   "neg",     "pos",      "not",     "binexpr", "and",  "or",
        "concat", "compare", "condexpr", "list",    "tuple",   "dict"};
    return Fail(absl::StrCat("can't assign to '",
                             kNames[static_cast<int>(e.kind)], "'"),
                e.line);
  }

  // Whether `name` is loaded anywhere in `body` (jinja2's find_undeclared).
  static bool UsesName(const Body& body, std::string_view name) {
    for (const auto& s : body) {
      if (StmtUses(*s, name)) return true;
    }
    return false;
  }
  static bool StmtUses(const Stmt& s, std::string_view name) {
    if (s.expr && ExprUses(*s.expr, name)) return true;
    if (s.cond && ExprUses(*s.cond, name)) return true;
    for (const auto& d : s.defaults) {
      if (ExprUses(*d, name)) return true;
    }
    for (const auto& v : s.with_values) {
      if (ExprUses(*v, name)) return true;
    }
    return UsesName(s.body, name) || UsesName(s.else_body, name);
  }
  static bool ExprUses(const Expr& e, std::string_view name) {
    if (e.kind == ExprKind::kName && e.name == name) return true;
    for (const auto& o : e.operands) {
      if (o && ExprUses(*o, name)) return true;
    }
    for (const auto& a : e.args) {
      if (ExprUses(*a, name)) return true;
    }
    for (const auto& [k, v] : e.kwargs) {
      if (ExprUses(*v, name)) return true;
    }
    return (e.dyn_args && ExprUses(*e.dyn_args, name)) ||
           (e.dyn_kwargs && ExprUses(*e.dyn_kwargs, name));
  }

  int loop_depth_ = 0;
  std::vector<std::string> tag_stack_;
  std::vector<std::vector<std::string>> end_token_stack_;
};

// jinja2 checks filter and test names when it compiles the template, except
// inside {% if %} bodies and conditional expressions ("soft" frames), where
// an unknown name fails only when reached.
class NameChecker {
 public:
  explicit NameChecker(std::string_view origin) : origin_(origin) {}

  absl::Status Body(const jinja::Body& body, bool soft) {
    for (const auto& s : body) RETURN_IF_ERROR(Statement(*s, soft));
    return absl::OkStatus();
  }

 private:
  absl::Status Statement(const Stmt& s, bool soft) {
    switch (s.kind) {
      case StmtKind::kIf:
        RETURN_IF_ERROR(Expression(s.expr.get(), true));
        RETURN_IF_ERROR(Body(s.body, true));
        return Body(s.else_body, true);
      case StmtKind::kFor:
        RETURN_IF_ERROR(Expression(s.expr.get(), soft));
        RETURN_IF_ERROR(Expression(s.cond.get(), false));
        RETURN_IF_ERROR(Body(s.body, false));
        return Body(s.else_body, false);
      default:
        break;
    }
    RETURN_IF_ERROR(Expression(s.expr.get(), soft));
    RETURN_IF_ERROR(Expression(s.cond.get(), soft));
    for (const auto& d : s.defaults)
      RETURN_IF_ERROR(Expression(d.get(), false));
    for (const auto& v : s.with_values)
      RETURN_IF_ERROR(Expression(v.get(), soft));
    RETURN_IF_ERROR(Body(s.body, false));
    return Body(s.else_body, false);
  }

  absl::Status Expression(const Expr* e, bool soft) {
    if (e == nullptr) return absl::OkStatus();
    if (e->kind == ExprKind::kCondExpr) soft = true;
    if (!e->known && !soft) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin_, ":", e->line, ": No ",
                       e->kind == ExprKind::kFilter ? "filter" : "test",
                       " named '", e->name, "'."));
    }
    for (const auto& o : e->operands)
      RETURN_IF_ERROR(Expression(o.get(), soft));
    for (const auto& a : e->args) RETURN_IF_ERROR(Expression(a.get(), soft));
    for (const auto& [k, v] : e->kwargs)
      RETURN_IF_ERROR(Expression(v.get(), soft));
    RETURN_IF_ERROR(Expression(e->dyn_args.get(), soft));
    return Expression(e->dyn_kwargs.get(), soft);
  }

  std::string origin_;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(std::string_view source,
                                   std::string_view origin) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source, origin));
  Parser parser(std::move(tokens), origin);
  ASSIGN_OR_RETURN(Body body, parser.Run());
  NameChecker checker(origin);
  RETURN_IF_ERROR(checker.Body(body, false));
  MarkConstantExpressions(body);
  return body;
}

}  // namespace pdserve::jinja
