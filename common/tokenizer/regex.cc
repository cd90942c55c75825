#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode.h"

namespace pdserve::tok {
namespace {

// Oniguruma's Unicode \s is White_Space: TAB..CR, NEL and the Z categories.
constexpr std::string_view kSpaceClassBody = "\\t-\\r\\x{85}\\p{Z}";
constexpr std::string_view kWordClassBody = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kHexClassBody = "0-9a-fA-F";

// Per-thread match data, large enough for the whole-match offsets (PCRE2
// still fills ovector[0..1] when a pattern has more groups than pairs).
struct ThreadMatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(data); }
};
pcre2_match_data* MatchData() {
  thread_local ThreadMatchData md;
  return md.data;
}

bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
         (c >= 'A' && c <= 'F');
}

}  // namespace

std::string OnigurumaToPcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      auto cls = [&](std::string_view body, bool negate) {
        if (in_class) {
          out.append(body);
        } else {
          out.append(negate ? "[^" : "[");
          out.append(body);
          out.push_back(']');
        }
      };
      if (e == 's' || e == 'w' || e == 'h') {
        cls(e == 's' ? kSpaceClassBody
                     : (e == 'w' ? kWordClassBody : kHexClassBody),
            false);
        i += 2;
        continue;
      }
      if ((e == 'S' || e == 'W' || e == 'H') && !in_class) {
        cls(e == 'S' ? kSpaceClassBody
                     : (e == 'W' ? kWordClassBody : kHexClassBody),
            true);
        i += 2;
        continue;
      }
      if (e == 'H' && in_class) {  // no in-class negation: approximate
        out.append("\\x{0}-/:-@G-`g-\\x{10FFFF}");
        i += 2;
        continue;
      }
      if ((e == 'p' || e == 'P') && i + 3 < p.size() && p[i + 2] == '{' &&
          p[i + 3] == '^') {
        out.push_back('\\');
        out.push_back(e == 'p' ? 'P' : 'p');
        out.push_back('{');
        i += 4;
        continue;
      }
      if (e == 'u' && i + 6 <= p.size() && IsHex(p[i + 2]) && IsHex(p[i + 3]) &&
          IsHex(p[i + 4]) && IsHex(p[i + 5])) {
        out.append("\\x{");
        out.append(p.substr(i + 2, 4));
        out.push_back('}');
        i += 6;
        continue;
      }
      // Any other escape: copy the backslash and the whole escaped char.
      out.push_back('\\');
      const int len = Utf8LeadLength(static_cast<unsigned char>(e));
      out.append(p.substr(i + 1, len));
      i += 1 + len;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      // A leading '^' and/or ']' are literal parts of the class.
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(
    std::string_view onig_pattern) {
  const std::string pattern = OnigurumaToPcre2(onig_pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                                   pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot compile regex \"", std::string(onig_pattern), "\" (as \"",
        pattern, "\"): ", reinterpret_cast<char*>(message), " at offset ",
        offset));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to interpreter
  return std::make_unique<Regex>(CodePtr(code));
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(std::string_view s) {
  std::string quoted;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) !=
        std::string_view::npos) {
      quoted.push_back('\\');
    }
    quoted.push_back(c);
  }
  return Compile(quoted);
}

void Regex::CodeFree::operator()(pcre2_code* code) const {
  pcre2_code_free(code);
}

void Regex::ForEachMatch(std::string_view text,
                         const std::function<void(size_t, size_t)>& fn) const {
  pcre2_match_data* md = MatchData();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last_end = 0;
  std::optional<size_t> last_match_end;
  while (last_end <= text.size()) {
    const int rc = pcre2_match(code_.get(), subject, text.size(), last_end,
                               PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;  // no match (or a resource limit: stop matching)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (s == e && last_match_end == e) {
      last_end +=
          last_end < text.size()
              ? Utf8LeadLength(static_cast<unsigned char>(text[last_end]))
              : 1;
      continue;
    }
    last_end = e;
    last_match_end = e;
    fn(s, e);
  }
}

void Regex::FindMatches(std::string_view text,
                        std::vector<MatchPiece>* out) const {
  out->clear();
  if (text.empty()) {
    out->push_back({0, 0, false});
    return;
  }
  size_t prev = 0;
  ForEachMatch(text, [&](size_t s, size_t e) {
    if (prev != s) out->push_back({prev, s, false});
    out->push_back({s, e, true});
    prev = e;
  });
  if (prev != text.size()) out->push_back({prev, text.size(), false});
}

std::string Regex::ReplaceAll(std::string_view text,
                              std::string_view content) const {
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  ForEachMatch(text, [&](size_t s, size_t e) {
    out.append(text.substr(prev, s - prev));
    out.append(content);
    prev = e;
  });
  out.append(text.substr(prev));
  return out;
}

void FindCharMatches(std::string_view text,
                     const std::function<bool(char32_t)>& pred,
                     std::vector<MatchPiece>* out) {
  out->clear();
  if (text.empty()) {
    out->push_back({0, 0, false});
    return;
  }
  size_t last_offset = 0;
  size_t i = 0;
  while (i < text.size()) {
    const size_t b = i;
    const char32_t c = NextCodePoint(text, &i);
    if (pred(c)) {
      if (last_offset < b) out->push_back({last_offset, b, false});
      out->push_back({b, i, true});
      last_offset = i;
    }
  }
  if (text.size() > last_offset) {
    out->push_back({last_offset, text.size(), false});
  }
}

absl::StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported split behavior \"", std::string(name), "\""));
}

std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(
    const std::vector<MatchPiece>& matches, SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(matches.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& m : matches) {
        if (!m.is_match) out.emplace_back(m.begin, m.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const auto& m : matches) out.emplace_back(m.begin, m.end);
      break;
    case SplitBehavior::kContiguous:
      for (const auto& m : matches) {
        if (m.is_match == previous_match && !out.empty()) {
          out.back().second = m.end;
        } else {
          out.emplace_back(m.begin, m.end);
        }
        previous_match = m.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& m : matches) {
        if (m.is_match && !previous_match && !out.empty()) {
          out.back().second = m.end;
        } else {
          out.emplace_back(m.begin, m.end);
        }
        previous_match = m.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

}  // namespace pdserve::tok
