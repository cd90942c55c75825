// Added tokens (tokenizer.json "added_tokens"): the strings Hugging Face
// matches in the input before the model runs (special tokens such as <s>),
// with single_word / lstrip / rstrip / normalized honoured. Immutable after
// Build; safe to share between threads.
#ifndef PDSERVE_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
#define PDSERVE_COMMON_TOKENIZER_ADDED_VOCABULARY_H_

#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/tokenizer/normalizer.h"

namespace pdserve::tok {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// Leftmost-longest string matcher (a byte trie). Immutable after Add calls.
class TokenTrie {
 public:
  void Add(std::string_view s, int32_t value);
  // The value of the longest key starting at text[pos] (and its length in
  // *len), or -1.
  int32_t LongestAt(std::string_view text, size_t pos, size_t* len) const;
  bool MayStartWith(unsigned char c) const { return first_bytes_[c]; }

 private:
  absl::flat_hash_map<uint64_t, int32_t> edges_;  // node * 256 + byte -> node
  std::vector<int32_t> value_{-1};                // per node, -1 = none
  std::bitset<256> first_bytes_;
};

class AddedVocabulary {
 public:
  // A piece of the input: an added token (id >= 0) or plain text (id = -1).
  struct Segment {
    size_t begin;
    size_t end;
    int32_t id;
  };

  // `normalizer` (may be null) normalizes the contents of normalized tokens.
  void Build(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // HF AddedVocabulary::find_matches over the non-normalized tokens (raw
  // input) or the normalized ones (normalized text). Empty pieces omitted.
  void Split(std::string_view text, bool normalized_tokens,
             std::vector<Segment>* out) const;

  const AddedToken* FindById(int32_t id) const;
  std::optional<int32_t> FindByContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, int32_t> by_content_;
  TokenTrie raw_trie_;         // values index tokens_
  TokenTrie normalized_trie_;  // values index tokens_
  bool has_raw_ = false;
  bool has_normalized_ = false;
};

}  // namespace pdserve::tok

#endif  // PDSERVE_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
