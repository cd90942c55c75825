// Hugging Face decoders (ByteLevel, Replace, ByteFallback, Fuse, Strip,
// Metaspace, Sequence): turn the token strings of some ids back into text.
// Immutable after construction; safe to share between threads.
#ifndef PDSERVE_COMMON_TOKENIZER_DECODER_H_
#define PDSERVE_COMMON_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace pdserve::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF decode_chain: rewrites the list of token strings.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// Builds a decoder from its tokenizer.json object; unknown types fail with
// INVALID_ARGUMENT naming the type (json exceptions are caught by Load).
absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const nlohmann::json& j);

}  // namespace pdserve::tok

#endif  // PDSERVE_COMMON_TOKENIZER_DECODER_H_
