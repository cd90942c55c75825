// Hugging Face post-processors for a single sequence (TemplateProcessing,
// BertProcessing, RobertaProcessing, ByteLevel, Sequence): add the special
// tokens around the encoded ids when add_special_tokens is requested.
// Immutable after construction; safe to share between threads.
#ifndef PDSERVE_COMMON_TOKENIZER_POST_PROCESSOR_H_
#define PDSERVE_COMMON_TOKENIZER_POST_PROCESSOR_H_

#include <cstdint>
#include <memory>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace pdserve::tok {

class PostProcessor {
 public:
  // A template: each element is either the sequence itself (monostate) or
  // literal special-token ids. ByteLevel contributes an empty template
  // (identity); Sequence composes templates.
  using Piece = std::variant<std::monostate, std::vector<int32_t>>;

  explicit PostProcessor(std::vector<Piece> single)
      : single_(std::move(single)) {}
  // Returns the ids with the template applied.
  std::vector<int32_t> Apply(const std::vector<int32_t>& ids) const;
  // The ids the template adds in front of / after the sequence.
  const std::vector<Piece>& single() const { return single_; }

 private:
  std::vector<Piece> single_;
};

// Builds a post-processor from its tokenizer.json object; unknown types fail
// with INVALID_ARGUMENT naming the type (json exceptions are caught by Load).
absl::StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(
    const nlohmann::json& j);

}  // namespace pdserve::tok

#endif  // PDSERVE_COMMON_TOKENIZER_POST_PROCESSOR_H_
