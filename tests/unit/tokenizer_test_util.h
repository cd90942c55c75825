// Shared helpers for the tokenizer tests: reference-file loading and UTF-8
// checks. Test-only; no state.
#ifndef PDSERVE_TESTS_UNIT_TOKENIZER_TEST_UTIL_H_
#define PDSERVE_TESTS_UNIT_TOKENIZER_TEST_UTIL_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace pdserve::testing_util {

inline std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

inline bool IsValidUtf8(const std::string& s) {
  return tok::FindInvalidUtf8(s) == std::string::npos;
}

// The three fixture tokenizers under tests/data/tokenizers/.
inline const std::vector<std::string>& FixtureNames() {
  static const std::vector<std::string> names = {"llama2", "gpt2", "falcon"};
  return names;
}

inline std::string FixtureDir(const std::string& name) {
  return "tests/data/tokenizers/" + name;
}

}  // namespace pdserve::testing_util

#endif  // PDSERVE_TESTS_UNIT_TOKENIZER_TEST_UTIL_H_
