#include "common/tokenizer/json_util.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode.h"

namespace pdserve::tok {

// A HF pattern object: {"String": "..."} or {"Regex": "..."}.
absl::StatusOr<std::unique_ptr<Regex>> MakePattern(const nlohmann::json& j) {
  if (j.contains("String")) {
    return Regex::Literal(j.at("String").get<std::string>());
  }
  if (j.contains("Regex")) {
    return Regex::Compile(j.at("Regex").get<std::string>());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "pattern must be {\"String\"} or {\"Regex\"}, got ", j.dump()));
}

absl::StatusOr<char32_t> SingleChar(const std::string& s, const char* what) {
  size_t i = 0;
  if (!s.empty() && FindInvalidUtf8(s) == std::string::npos) {
    const char32_t c = NextCodePoint(s, &i);
    if (i == s.size()) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be exactly one character, got \"", s, "\""));
}

}  // namespace pdserve::tok
