// Recursive-descent parser for Jinja2 templates (the grammar of
// jinja2.parser, with the loopcontrols extension and transformers'
// {% generation %} tag). Syntax errors are INVALID_ARGUMENT
// "origin:line: message" with jinja2's wording. Nesting is bounded, so
// hostile templates cannot exhaust the stack. Thread-safe (no shared state).
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_PARSER_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "common/chat_template/ast.h"
#include "common/chat_template/token_stream.h"

namespace pdserve::jinja {

absl::StatusOr<Body> ParseTemplate(std::string_view source,
                                   std::string_view origin);

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_PARSER_H_
