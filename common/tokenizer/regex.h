// Pattern matching with Hugging Face `tokenizers` semantics: a PCRE2 regex
// (UTF + UCP, JIT) compiled from an Oniguruma pattern, HF's find_matches
// (matches and the gaps between them), and the split delimiter behaviours.
// Regex is immutable after Compile and safe to use from many threads.
#ifndef PDSERVE_COMMON_TOKENIZER_REGEX_H_
#define PDSERVE_COMMON_TOKENIZER_REGEX_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

struct pcre2_real_code_8;

namespace pdserve::tok {

// One piece of HF find_matches: [begin, end) and whether it is a match.
struct MatchPiece {
  size_t begin;
  size_t end;
  bool is_match;
};

// Translates an Oniguruma (Ruby syntax) pattern to PCRE2: \s \S \w \W \h \H
// get Oniguruma's Unicode meaning, \p{^X} -> \P{X}, \uHHHH -> \x{HHHH}.
std::string OnigurumaToPcre2(std::string_view pattern);

// A compiled regex. Thread-safe (match data is per thread).
class Regex {
 public:
  // Compiles an Oniguruma-dialect pattern (as found in tokenizer.json).
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(
      std::string_view onig_pattern);
  // Compiles a literal string (HF `String` patterns).
  static absl::StatusOr<std::unique_ptr<Regex>> Literal(std::string_view s);
  struct CodeFree {
    void operator()(pcre2_real_code_8* code) const;
  };
  using CodePtr = std::unique_ptr<pcre2_real_code_8, CodeFree>;
  // Use Compile/Literal; public for std::make_unique.
  explicit Regex(CodePtr code) : code_(std::move(code)) {}

  // Non-overlapping matches with the Rust `onig` crate's find_iter rules
  // (an empty match right after the previous match is skipped). `text` must
  // be valid UTF-8.
  void ForEachMatch(std::string_view text,
                    const std::function<void(size_t, size_t)>& fn) const;
  // HF Pattern::find_matches: the matches and the gaps, covering `text`.
  void FindMatches(std::string_view text, std::vector<MatchPiece>* out) const;
  // Replaces every match with `content`.
  std::string ReplaceAll(std::string_view text, std::string_view content) const;

 private:
  CodePtr code_;
};

// HF find_matches for a per-character predicate: each matching char is one
// match.
void FindCharMatches(std::string_view text,
                     const std::function<bool(char32_t)>& pred,
                     std::vector<MatchPiece>* out);

// HF SplitDelimiterBehavior.
enum class SplitBehavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};
absl::StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name);

// Applies a behaviour to find_matches output; returns the kept [begin, end)
// ranges (possibly empty ones, which callers drop like HF does).
std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(
    const std::vector<MatchPiece>& matches, SplitBehavior behavior);

}  // namespace pdserve::tok

#endif  // PDSERVE_COMMON_TOKENIZER_REGEX_H_
