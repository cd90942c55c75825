// The builtins a template can reach, with jinja2's and Python's semantics:
// operators (operators.cc), filters (filters.cc, filters_text.cc,
// filters_seq.cc), tests (predicates.cc), methods of str/dict/list
// (methods.cc) and the global functions (globals.cc: range, namespace, dict,
// raise_exception, strftime_now, ...). All are stateless; per-render state
// is in the Renderer.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_BUILTINS_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_BUILTINS_H_

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template/ast.h"
#include "common/chat_template/evaluator.h"
#include "common/chat_template/value.h"

namespace pdserve::jinja {

// Names jinja2 defines (some filters are recognized but unsupported and fail
// when called).
bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

absl::StatusOr<Value> ApplyFilter(Renderer& r, std::string_view name,
                                  const Value& input, CallArgs& args);
absl::StatusOr<bool> ApplyTest(Renderer& r, std::string_view name,
                               const Value& v, CallArgs& args);
// String filters (filters_text.cc); nullopt when `name` is not one of them.
bool IsTextFilter(std::string_view name);
std::optional<absl::StatusOr<Value>> ApplyTextFilter(Renderer& r,
                                                     std::string_view name,
                                                     const Value& input,
                                                     CallArgs& args);
// Filter arguments (filters.cc), each optional with a default: an int (a
// TypeError for what is not one), a truth value, str().
absl::StatusOr<int64_t> IntArg(const std::optional<Value>& v, int64_t def);
bool BoolArg(const std::optional<Value>& v, bool def);
std::string StrArg(const std::optional<Value>& v, std::string_view def);
// A filter's string result, within the render's string and step limits.
absl::StatusOr<Value> CheckedString(Renderer& r, std::string s);
// Sequence filters (filters_seq.cc); nullopt when `name` is not one of them.
std::optional<absl::StatusOr<Value>> ApplySequenceFilter(Renderer& r,
                                                         std::string_view name,
                                                         const Value& input,
                                                         CallArgs& args);

// Methods of builtin types: whether `self.name` is a method, and whether the
// sandbox forbids it (a mutating method of list/dict).
enum class MethodKind { kNone, kSafe, kUnsafe };
MethodKind FindMethod(const Value& self, std::string_view name);
absl::StatusOr<Value> CallMethod(Renderer& r, const Value& self,
                                 std::string_view name, CallArgs& args);

// A global function or nullptr.
const Value* FindGlobal(std::string_view name);

// Operators with Python semantics (ints are 64-bit; overflow is an error).
absl::StatusOr<Value> BinaryOp(Renderer& r, BinOp op, const Value& a,
                               const Value& b);
absl::StatusOr<Value> Negate(const Value& v);
absl::StatusOr<Value> UnaryPlus(const Value& v);
// ==, !=, <, <=, >, >= (kIn/kNotIn: `a in b`).
absl::StatusOr<bool> CompareOp(Renderer& r, CmpOp op, const Value& a,
                               const Value& b);
absl::StatusOr<bool> Contains(Renderer& r, const Value& container,
                              const Value& item);
absl::StatusOr<bool> Less(const Value& a, const Value& b);
// TypeError unless v can be a dict key / set member.
absl::Status CheckHashable(const Value& v);

// Binds call arguments to parameter names like a Python signature:
// result[i] holds the argument for params[i] when one was given.
absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(
    std::string_view fn, const CallArgs& args,
    std::initializer_list<std::string_view> params);

// Python int(x) / float(x) conversions used by filters.
std::optional<int64_t> ParsePyInt(std::string_view s, int base);
std::optional<double> ParsePyFloat(std::string_view s);

// "abc" -> ["a", "b", "c"] as values.
std::vector<Value> StringChars(const std::string& s);

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_BUILTINS_H_
