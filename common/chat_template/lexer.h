// Jinja2's lexer with the settings transformers uses for chat templates
// (trim_blocks, lstrip_blocks, no line statements, keep_trailing_newline off):
// splits template source into text and the tokens inside {{ }} and {% %},
// applying whitespace control ({%- -%}, {%+ +%}) and {% raw %} exactly as
// jinja2.lexer does. Stateless apart from one call; thread-safe.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_LEXER_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_LEXER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::jinja {

enum class TokenType : uint8_t {
  kData,
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEof,
};

// One token of the template source (a value type).
struct Token {
  TokenType type = TokenType::kEof;
  std::string value;  // text, name, decoded string, or operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// A syntax error here is INVALID_ARGUMENT "origin:line: message".
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source,
                                            std::string_view origin);

// Human-readable token for parser errors ("end of print statement", ...).
std::string DescribeToken(const Token& t);

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_LEXER_H_
