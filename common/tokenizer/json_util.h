// Small helpers for reading tokenizer.json fields with HF defaults.
// Stateless; they may throw nlohmann::json::exception on wrong types, which
// Tokenizer::Load turns into a status.
#ifndef PDSERVE_COMMON_TOKENIZER_JSON_UTIL_H_
#define PDSERVE_COMMON_TOKENIZER_JSON_UTIL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json.hpp"

namespace pdserve::tok {

// j[key] as T, or `fallback` when the key is absent or null.
template <typename T>
T JsonOr(const nlohmann::json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

// The "type" field of a component ("" when absent).
inline std::string JsonType(const nlohmann::json& j) {
  return JsonOr<std::string>(j, "type", "");
}

// A HF pattern object: {"String": "..."} (literal) or {"Regex": "..."}.
absl::StatusOr<std::unique_ptr<Regex>> MakePattern(const nlohmann::json& j);

// `s` as exactly one character; `what` names the field in the error.
absl::StatusOr<char32_t> SingleChar(const std::string& s, const char* what);

}  // namespace pdserve::tok

#endif  // PDSERVE_COMMON_TOKENIZER_JSON_UTIL_H_
