// Shared helpers for the chat template tests: JSONL loading (key order kept)
// and the reference-line -> ChatTemplateInput mapping of
// tests/data/chat_templates/*.jsonl. Test-only; no state.
#ifndef PDSERVE_TESTS_UNIT_CHAT_TEMPLATE_TEST_UTIL_H_
#define PDSERVE_TESTS_UNIT_CHAT_TEMPLATE_TEST_UTIL_H_

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/chat_template/chat_template.h"
#include "nlohmann/json.hpp"

namespace pdserve::testing_util {

inline constexpr char kChatTemplateData[] = "tests/data/chat_templates";

inline std::vector<nlohmann::ordered_json> ReadOrderedJsonl(
    const std::string& path) {
  std::vector<nlohmann::ordered_json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(nlohmann::ordered_json::parse(line));
  }
  return rows;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// 26 Jul 2024 12:00 UTC: the date the references pin strftime_now to.
inline std::time_t PinnedNow() {
  setenv("TZ", "UTC", 1);
  tzset();
  return 1721995200;
}

// The render inputs of one reference line (missing fields take defaults).
inline ChatTemplateInput InputFromLine(const nlohmann::ordered_json& line) {
  ChatTemplateInput in;
  in.messages = line.value("messages", nlohmann::ordered_json::array());
  in.add_generation_prompt = line.value("add_generation_prompt", true);
  if (line.contains("tools")) in.tools = line["tools"];
  in.bos_token = line.value("bos_token", "");
  in.eos_token = line.value("eos_token", "");
  if (line.contains("kwargs")) in.kwargs = line["kwargs"];
  in.now = PinnedNow();
  return in;
}

}  // namespace pdserve::testing_util

#endif  // PDSERVE_TESTS_UNIT_CHAT_TEMPLATE_TEST_UTIL_H_
