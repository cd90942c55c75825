// Hugging Face tokenizer.json (BPE: sentencepiece-style and byte-level) with
// the semantics of the `tokenizers` library, and a streaming-safe incremental
// detokenizer. Used by the router and by `pdserve complete`/`tokenize`.
//
// Input and configuration rules:
//  - Encode rejects text that is not valid UTF-8 with INVALID_ARGUMENT
//    ("invalid UTF-8 at byte N"); it never guesses a replacement.
//  - tokenizer.json's post_processor decides what add_special_tokens adds
//    (as in `tokenizers`). tokenizer_config.json (next to tokenizer.json) is
//    read for bos_token / eos_token, and its add_bos_token / add_eos_token
//    are used only when tokenizer.json has no post_processor.
//  - truncation / padding in tokenizer.json are ignored.
#ifndef PDSERVE_COMMON_TOKENIZER_TOKENIZER_H_
#define PDSERVE_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace pdserve {

struct TokenizerOptions {
  bool word_cache = true;  // BPE per-word merge cache (for benchmarks)
};

// A loaded tokenizer. Immutable after Load (apart from an internal
// mutex-protected cache): Encode/Decode may run concurrently.
class Tokenizer {
 public:
  // path: a model directory (tokenizer.json + optional tokenizer_config.json)
  // or a tokenizer.json file. A corrupt or unsupported file gives
  // INVALID_ARGUMENT naming the problem; a missing one NOT_FOUND.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(
      const std::string& path, const TokenizerOptions& options = {});

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const;
  // Ids outside [0, vocab_size()) give INVALID_ARGUMENT naming the id; ids
  // inside the range that name no token are skipped (as HF does).
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens) const;

  // One past the largest token id (model vocabulary and added tokens).
  int32_t vocab_size() const { return vocab_size_; }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  bool IsSpecial(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token string of an id (added token content or vocabulary entry).
  std::optional<std::string> IdToToken(int32_t id) const;

  // Use Load.
  Tokenizer() = default;

 private:
  absl::Status Init(const std::string& json_text,
                    const std::string& config_text,
                    const TokenizerOptions& options);
  void EncodeText(std::string_view segment, bool at_input_start,
                  std::vector<int32_t>* ids) const;

  std::unique_ptr<tok::Normalizer> normalizer_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tok::BpeModel> model_;
  std::unique_ptr<tok::PostProcessor> post_processor_;
  std::unique_ptr<tok::Decoder> decoder_;
  tok::AddedVocabulary added_;
  absl::flat_hash_set<std::string> special_contents_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
};

// Streaming detokenizer: feed ids one at a time; each call returns a text
// delta that is valid UTF-8 (text ending in an incomplete character or
// U+FFFD is held back). One per request; not thread-safe.
//
// Rule: without prompt_ids, the deltas (+ Flush()) concatenate to exactly
// Decode(all ids fed, skip_special_tokens). With prompt_ids they concatenate
// to Decode(prompt + output) minus its prefix Decode(prompt), i.e. the
// continuation text as HF would print prompt+output (for sentencepiece models
// this keeps the space before the first generated word, which
// Decode(output) alone would strip). Technique: decode a small window
// ids[prefix_offset:] and emit what it adds to ids[prefix_offset:read_offset].
// Known limit: a byte-fallback run that is not valid UTF-8 (only produced by a
// model emitting garbage bytes) is decoded by HF as U+FFFD per byte for the
// whole run, including characters already streamed; the stream then emits
// U+FFFD only for the new bytes.
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens,
                         absl::Span<const int32_t> prompt_ids = {});
  // INVALID_ARGUMENT for an out-of-range id (the id is not kept).
  absl::StatusOr<std::string> Add(int32_t id);
  // What Add(id) would return now, without adding it (the text an
  // alternative token would have added in this place).
  absl::StatusOr<std::string> Peek(int32_t id) const;
  // Emits whatever is held back (e.g. an incomplete UTF-8 tail as U+FFFD).
  std::string Flush();

 private:
  absl::StatusOr<std::string> DecodeFrom(size_t begin) const;
  std::string Emit(const std::string& new_text);
  // The part of new_text (a decode of the window plus new ids) after the
  // window's known text prefix_text_.
  std::string DeltaAfterPrefix(const std::string& new_text) const;

  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
  std::string prefix_text_;  // Decode(ids_[prefix_offset_:read_offset_])
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_TOKENIZER_H_
