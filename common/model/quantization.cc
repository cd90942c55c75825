#include "common/model/quantization.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pdserve {

std::string QuantFormat::ToString() const {
  std::string s = absl::StrCat("int", bits);
  if (group_size == DefaultGroupSize(bits)) {
    // the flag's default: no suffix
  } else if (group_size == 0) {
    absl::StrAppend(&s, "-pc");
  } else {
    absl::StrAppend(&s, "-g", group_size);
  }
  if (!symmetric) absl::StrAppend(&s, "-asym");
  return s;
}

absl::StatusOr<std::optional<QuantFormat>> ParseQuantization(
    absl::string_view text) {
  if (text.empty() || text == "none") return std::nullopt;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad --quantization '", text, "': ", why,
        " (use none, int8 or int4, optionally -g32|-g64|-g128|-pc and -asym, "
        "e.g. int4-g128)"));
  };
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  QuantFormat f;
  if (parts[0] == "int8") {
    f.bits = 8;
  } else if (parts[0] == "int4") {
    f.bits = 4;
  } else {
    return bad("bits must be int8 or int4");
  }
  f.group_size = QuantFormat::DefaultGroupSize(f.bits);
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (p == "asym") {
      f.symmetric = false;
    } else if (p == "pc") {
      f.group_size = 0;
    } else if (p.size() > 1 && p[0] == 'g') {
      int g = 0;
      if (!absl::SimpleAtoi(p.substr(1), &g) || g <= 0 || g % 32 != 0) {
        return bad("the group size must be a positive multiple of 32");
      }
      f.group_size = g;
    } else {
      return bad(absl::StrCat("unknown part '", p, "'"));
    }
  }
  return f;
}

}  // namespace pdserve
