// Hugging Face pre-tokenizers (ByteLevel, Split, Digits, Punctuation,
// Metaspace, Whitespace, WhitespaceSplit, CharDelimiterSplit, Sequence):
// they cut a normalized segment into the pieces the model tokenizes.
// Immutable after construction; safe to share between threads.
#ifndef PDSERVE_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define PDSERVE_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace pdserve::tok {

// One piece of pre-tokenized text. `first` is true when the piece starts at
// offset 0 of the original input (HF offsets_original().0 == 0, used by
// Metaspace's prepend_scheme "first").
struct PreToken {
  std::string text;
  bool first = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece by its sub-pieces (empty pieces are dropped).
  virtual void PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

// Metaspace's prepend_scheme (pre-tokenizer and decoder); read from
// "prepend_scheme" or, in older files, "add_prefix_space" (always/never).
enum class PrependScheme { kAlways, kFirst, kNever };
absl::StatusOr<PrependScheme> ParsePrependScheme(const nlohmann::json& j);

// Builds a pre-tokenizer from its tokenizer.json object; unknown types fail
// with INVALID_ARGUMENT naming the type (json exceptions are caught by Load).
absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(
    const nlohmann::json& j);

}  // namespace pdserve::tok

#endif  // PDSERVE_COMMON_TOKENIZER_PRE_TOKENIZER_H_
