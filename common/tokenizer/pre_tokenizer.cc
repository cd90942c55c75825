#include "common/tokenizer/pre_tokenizer.h"

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode.h"
#include "common/util/status_macros.h"

namespace pdserve::tok {
namespace {

// GPT-2's pre-tokenization regex (HF ByteLevel with use_regex).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Splits every piece with `find` (HF find_matches) and `behavior`.
void SplitPieces(std::vector<PreToken>* pieces, SplitBehavior behavior,
                 const std::function<void(std::string_view,
                                          std::vector<MatchPiece>*)>& find) {
  std::vector<PreToken> out;
  out.reserve(pieces->size() * 2);
  std::vector<MatchPiece> matches;
  for (PreToken& piece : *pieces) {
    find(piece.text, &matches);
    for (const auto& [b, e] : ApplySplitBehavior(matches, behavior)) {
      if (b == e) continue;
      if (b == 0 && e == piece.text.size()) {
        out.push_back(std::move(piece));
        break;
      }
      out.push_back({piece.text.substr(b, e - b), piece.first && b == 0});
    }
  }
  *pieces = std::move(out);
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, SplitBehavior behavior,
                    bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    SplitPieces(pieces, behavior_,
                [this](std::string_view text, std::vector<MatchPiece>* m) {
                  regex_->FindMatches(text, m);
                  if (invert_) {
                    for (auto& p : *m) p.is_match = !p.is_match;
                  }
                });
  }

 private:
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class CharPredicatePreTokenizer : public PreTokenizer {
 public:
  CharPredicatePreTokenizer(std::function<bool(char32_t)> pred,
                            SplitBehavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    SplitPieces(pieces, behavior_,
                [this](std::string_view text, std::vector<MatchPiece>* m) {
                  FindCharMatches(text, pred_, m);
                });
  }

 private:
  std::function<bool(char32_t)> pred_;
  SplitBehavior behavior_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    if (add_prefix_space_) {
      for (auto& p : *pieces) {
        if (p.text.empty() || p.text[0] != ' ')
          p.text.insert(p.text.begin(), ' ');
      }
    }
    if (regex_ != nullptr) {
      SplitPieces(pieces, SplitBehavior::kIsolated,
                  [this](std::string_view text, std::vector<MatchPiece>* m) {
                    regex_->FindMatches(text, m);
                  });
    }
    const auto& alphabet = ByteLevelAlphabet();
    std::string mapped;
    for (auto& p : *pieces) {
      mapped.clear();
      for (unsigned char c : p.text) mapped.append(alphabet[c]);
      p.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split) {
    AppendUtf8(replacement, &replacement_utf8_);
  }
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (auto& p : *pieces) {
      std::string replaced;
      replaced.reserve(p.text.size() + 3);
      for (char c : p.text) {
        if (c == ' ') {
          replaced.append(replacement_utf8_);
        } else {
          replaced.push_back(c);
        }
      }
      const bool starts =
          replaced.compare(0, replacement_utf8_.size(), replacement_utf8_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && p.first))) {
        replaced.insert(0, replacement_utf8_);
      }
      p.text = std::move(replaced);
    }
    if (split_) {
      const char32_t r = replacement_;
      SplitPieces(pieces, SplitBehavior::kMergedWithNext,
                  [r](std::string_view text, std::vector<MatchPiece>* m) {
                    FindCharMatches(
                        text, [r](char32_t c) { return c == r; }, m);
                  });
    }
  }

 private:
  char32_t replacement_;
  std::string replacement_utf8_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(
      std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& p : parts_) p->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

absl::StatusOr<PrependScheme> ParsePrependScheme(const nlohmann::json& j) {
  if (j.contains("prepend_scheme") && !j.at("prepend_scheme").is_null()) {
    const std::string s = j.at("prepend_scheme").get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported Metaspace prepend_scheme \"", s, "\""));
  }
  return JsonOr(j, "add_prefix_space", true) ? PrependScheme::kAlways
                                             : PrependScheme::kNever;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(
    const nlohmann::json& j) {
  const std::string type = JsonType(j);
  if (type == "ByteLevel") {
    std::unique_ptr<Regex> regex;
    if (JsonOr(j, "use_regex", true)) {
      ASSIGN_OR_RETURN(regex, Regex::Compile(kGpt2Pattern));
    }
    return std::make_unique<ByteLevelPreTokenizer>(
        JsonOr(j, "add_prefix_space", true), std::move(regex));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(auto regex, MakePattern(j.at("pattern")));
    ASSIGN_OR_RETURN(auto behavior,
                     ParseSplitBehavior(j.at("behavior").get<std::string>()));
    return std::make_unique<SplitPreTokenizer>(std::move(regex), behavior,
                                               JsonOr(j, "invert", false));
  }
  if (type == "Digits") {
    return std::make_unique<CharPredicatePreTokenizer>(
        IsNumeric, JsonOr(j, "individual_digits", false)
                       ? SplitBehavior::kIsolated
                       : SplitBehavior::kContiguous);
  }
  if (type == "Punctuation") {
    ASSIGN_OR_RETURN(auto behavior, ParseSplitBehavior(JsonOr<std::string>(
                                        j, "behavior", "Isolated")));
    return std::make_unique<CharPredicatePreTokenizer>(IsPunctuation, behavior);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharPredicatePreTokenizer>(IsWhitespace,
                                                       SplitBehavior::kRemoved);
  }
  if (type == "CharDelimiterSplit") {
    ASSIGN_OR_RETURN(char32_t delim,
                     SingleChar(j.at("delimiter").get<std::string>(),
                                "CharDelimiterSplit delimiter"));
    return std::make_unique<CharPredicatePreTokenizer>(
        [delim](char32_t c) { return c == delim; }, SplitBehavior::kRemoved);
  }
  if (type == "Whitespace") {
    ASSIGN_OR_RETURN(auto regex, Regex::Compile(R"(\w+|[^\w\s]+)"));
    return std::make_unique<SplitPreTokenizer>(
        std::move(regex), SplitBehavior::kRemoved, /*invert=*/true);
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(char32_t replacement,
                     SingleChar(JsonOr<std::string>(j, "replacement", "\u2581"),
                                "Metaspace replacement"));
    ASSIGN_OR_RETURN(auto scheme, ParsePrependScheme(j));
    return std::make_unique<MetaspacePreTokenizer>(replacement, scheme,
                                                   JsonOr(j, "split", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& item : j.at("pretokenizers")) {
      ASSIGN_OR_RETURN(auto part, MakePreTokenizer(item));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported pre_tokenizer type \"", type, "\""));
}

}  // namespace pdserve::tok
