// The token cursor the parser works on: lookahead, expectations with
// jinja2's error wording ("expected token 'x', got 'y'"), and a nesting
// guard. One per parse; not shared between threads.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_TOKEN_STREAM_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_TOKEN_STREAM_H_

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/chat_template/lexer.h"
#include "common/chat_template/value.h"

namespace pdserve::jinja {

inline constexpr int kMaxParseDepth = 128;

// The tokens of one template and the cursor over them; base of the parser.
// One per parse; not thread-safe.
class TokenStream {
 public:
  TokenStream(std::vector<Token> tokens, std::string_view origin)
      : tokens_(std::move(tokens)), origin_(origin) {}

 protected:
  // RAII nesting guard.
  class Nest {
   public:
    explicit Nest(TokenStream* p) : p_(p) { ++p_->depth_; }
    ~Nest() { --p_->depth_; }
    bool too_deep() const { return p_->depth_ > kMaxParseDepth; }

   private:
    TokenStream* p_;
  };

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Look() const {
    return tokens_[std::min(pos_ + 1, tokens_.size() - 1)];
  }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  static bool IsName(const Token& t, std::string_view v) {
    return t.type == TokenType::kName && t.value == v;
  }
  static bool IsOp(const Token& t, std::string_view op) {
    return t.type == TokenType::kOperator && t.value == op;
  }
  bool SkipName(std::string_view v) {
    if (!IsName(Cur(), v)) return false;
    Next();
    return true;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(Cur(), op)) return false;
    Next();
    return true;
  }

  absl::Status Fail(std::string_view msg, int line) const {
    return absl::InvalidArgumentError(
        absl::StrCat(origin_, ":", line, ": ", SV(msg)));
  }
  absl::Status Fail(std::string_view msg) const {
    return Fail(msg, Cur().line);
  }
  absl::Status TooDeep() const {
    return Fail(absl::StrCat("template nested deeper than ", kMaxParseDepth,
                             " levels"));
  }

  absl::Status ExpectFailure(std::string_view what) const {
    if (Cur().type == TokenType::kEof) {
      return Fail(absl::StrCat("unexpected end of template, expected '",
                               SV(what), "'."));
    }
    return Fail(absl::StrCat("expected token '", SV(what), "', got '",
                             DescribeToken(Cur()), "'"));
  }
  absl::Status Expect(TokenType type, std::string_view what) {
    if (Cur().type != type) return ExpectFailure(what);
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectOp(std::string_view op) {
    if (!IsOp(Cur(), op)) return ExpectFailure(op);
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) return ExpectFailure("name");
    std::string v = Cur().value;
    Next();
    return v;
  }
  absl::Status ExpectBlockEnd() {
    return Expect(TokenType::kBlockEnd, "end of statement block");
  }

  std::vector<Token> tokens_;
  std::string origin_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_TOKEN_STREAM_H_
