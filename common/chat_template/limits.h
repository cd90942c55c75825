// Bounds on one chat template render. A template that exceeds one fails with
// INVALID_ARGUMENT naming the limit, so hostile or buggy templates cannot
// crash the process, overflow the stack, hang, or exhaust memory.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_LIMITS_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_LIMITS_H_

#include <cstddef>
#include <cstdint>

namespace pdserve {

struct ChatTemplateLimits {
  // Nested evaluation frames (statements, expressions, macro calls). Jinja2
  // itself stops at Python's recursion limit, roughly this deep.
  int max_depth = 400;
  // Statements and expressions evaluated plus loop iterations (building a
  // string also costs one step per 64 bytes).
  int64_t max_steps = 10'000'000;
  // Any one string, including the rendered output.
  size_t max_string_bytes = 8u << 20;
  // Any one list, dict or range.
  size_t max_items = 1'000'000;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_LIMITS_H_
