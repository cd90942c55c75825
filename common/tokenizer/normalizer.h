// Hugging Face normalizers (NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend,
// Replace, Sequence) built from tokenizer.json. Normalizers are immutable
// after construction and safe to share between threads.
#ifndef PDSERVE_COMMON_TOKENIZER_NORMALIZER_H_
#define PDSERVE_COMMON_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace pdserve::tok {

// Rewrites a (valid UTF-8) string in place.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void Normalize(std::string* text) const = 0;
};

// Builds a normalizer from its tokenizer.json object. Unknown types fail with
// INVALID_ARGUMENT naming the type. May throw nlohmann::json::exception on
// malformed fields (Tokenizer::Load catches them).
absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(
    const nlohmann::json& j);

}  // namespace pdserve::tok

#endif  // PDSERVE_COMMON_TOKENIZER_NORMALIZER_H_
