#include "common/tokenizer/added_vocabulary.h"

#include <utf8proc.h>

#include <algorithm>
#include <utility>

#include "absl/strings/string_view.h"
#include "common/tokenizer/unicode.h"

namespace pdserve::tok {
namespace {

// Rust regex `\w`: alphabetic, marks, decimal digits, connector punctuation,
// join controls.
bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
           (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  const int cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_ME) ||
         cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
         cat == UTF8PROC_CATEGORY_PC;
}

// Start of the code point that ends right before `end`.
size_t PrevCharStart(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

bool EndsWithWord(std::string_view s, size_t end) {
  if (end == 0) return false;
  size_t i = PrevCharStart(s, end);
  return IsWordChar(NextCodePoint(s, &i));
}

bool StartsWithWord(std::string_view s, size_t begin) {
  if (begin >= s.size()) return false;
  return IsWordChar(NextCodePoint(s, &begin));
}

}  // namespace

void TokenTrie::Add(std::string_view s, int32_t value) {
  if (s.empty()) return;
  first_bytes_.set(static_cast<unsigned char>(s[0]));
  int32_t node = 0;
  for (unsigned char c : s) {
    const uint64_t key = static_cast<uint64_t>(node) * 256 + c;
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      const int32_t child = static_cast<int32_t>(value_.size());
      value_.push_back(-1);
      edges_.emplace(key, child);
      node = child;
    } else {
      node = it->second;
    }
  }
  if (value_[node] < 0) value_[node] = value;
}

int32_t TokenTrie::LongestAt(std::string_view text, size_t pos,
                             size_t* len) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find(static_cast<uint64_t>(node) * 256 +
                          static_cast<unsigned char>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (value_[node] >= 0) {
      best = value_[node];
      *len = i + 1 - pos;
    }
  }
  return best;
}

void AddedVocabulary::Build(std::vector<AddedToken> tokens,
                            const Normalizer* normalizer) {
  tokens_ = std::move(tokens);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    by_id_[t.id] = i;
    by_content_.emplace(t.content, t.id);
    if (t.content.empty()) continue;
    if (t.normalized) {
      std::string pattern = t.content;
      if (normalizer != nullptr) normalizer->Normalize(&pattern);
      normalized_trie_.Add(pattern, static_cast<int32_t>(i));
      has_normalized_ = true;
    } else {
      raw_trie_.Add(t.content, static_cast<int32_t>(i));
      has_raw_ = true;
    }
  }
}

void AddedVocabulary::Split(std::string_view text, bool normalized_tokens,
                            std::vector<Segment>* out) const {
  out->clear();
  const TokenTrie& trie = normalized_tokens ? normalized_trie_ : raw_trie_;
  const bool any = normalized_tokens ? has_normalized_ : has_raw_;
  size_t start_offset = 0;
  if (any) {
    size_t pos = 0;
    while (pos < text.size()) {
      if (!trie.MayStartWith(static_cast<unsigned char>(text[pos]))) {
        ++pos;
        continue;
      }
      size_t len = 0;
      const int32_t index = trie.LongestAt(text, pos, &len);
      if (index < 0) {
        ++pos;
        continue;
      }
      size_t start = pos;
      size_t stop = pos + len;
      pos = stop;  // the matcher continues after the match, as in HF
      const AddedToken& token = tokens_[index];
      if (token.single_word &&
          (EndsWithWord(text, start) || StartsWithWord(text, stop))) {
        continue;
      }
      if (token.lstrip) {
        size_t s = start;
        while (s > 0) {
          const size_t prev = PrevCharStart(text, s);
          size_t i = prev;
          if (!IsWhitespace(NextCodePoint(text, &i))) break;
          s = prev;
        }
        start = std::max(s, start_offset);
      }
      if (token.rstrip) {
        while (stop < text.size()) {
          size_t i = stop;
          if (!IsWhitespace(NextCodePoint(text, &i))) break;
          stop = i;
        }
        pos = stop;  // never match inside the stripped spaces
      }
      start = std::max(start, start_offset);
      if (start_offset < start) out->push_back({start_offset, start, -1});
      out->push_back({start, stop, token.id});
      start_offset = stop;
    }
  }
  if (start_offset < text.size()) {
    out->push_back({start_offset, text.size(), -1});
  }
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::FindByContent(
    std::string_view content) const {
  auto it = by_content_.find(absl::string_view(content.data(), content.size()));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

}  // namespace pdserve::tok
