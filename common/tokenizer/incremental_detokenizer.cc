// IncrementalDetokenizer (declared in tokenizer.h).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "common/util/status_macros.h"

namespace pdserve {
namespace {

// How many prompt tokens the first window looks back, and at most how far
// it looks for a clean window start.
constexpr size_t kPromptWindow = 5;
constexpr size_t kMaxPromptWindow = 64;

bool EndsWithReplacement(const std::string& s) {
  return s.size() >= tok::kReplacementUtf8.size() &&
         s.compare(s.size() - tok::kReplacementUtf8.size(),
                   tok::kReplacementUtf8.size(), tok::kReplacementUtf8) == 0;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

absl::Status CheckTokenId(const Tokenizer& tok, int32_t id) {
  if (id >= 0 && id < tok.vocab_size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "token id ", id, " is out of range [0, ", tok.vocab_size(), ")"));
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(
    const Tokenizer& tok, bool skip_special_tokens,
    absl::Span<const int32_t> prompt_ids)
    : tok_(tok),
      skip_special_(skip_special_tokens),
      ids_(prompt_ids.begin(), prompt_ids.end()) {
  read_offset_ = ids_.size();
  if (ids_.empty()) return;
  // Start the window a few tokens back, at a point whose text is non-empty
  // (so a leading-space strip falls inside the already-known part) and does
  // not begin inside a character.
  const size_t n = ids_.size();
  const size_t floor = n > kMaxPromptWindow ? n - kMaxPromptWindow : 0;
  size_t p = n > kPromptWindow ? n - kPromptWindow : 0;
  while (true) {
    auto text = DecodeFrom(p);
    if (!text.ok()) {  // bad prompt ids: fall back to no prompt context
      ids_.clear();
      read_offset_ = 0;
      return;
    }
    if (!text->empty() &&
        !StartsWith(*text, std::string(tok::kReplacementUtf8))) {
      prefix_offset_ = p;
      prefix_text_ = *std::move(text);
      return;
    }
    if (p == 0 || p == floor) break;
    --p;
  }
  prefix_offset_ = 0;
  prefix_text_ = DecodeFrom(0).value_or("");
}

absl::StatusOr<std::string> IncrementalDetokenizer::DecodeFrom(
    size_t begin) const {
  return tok_.Decode(absl::MakeConstSpan(ids_).subspan(begin), skip_special_);
}

std::string IncrementalDetokenizer::DeltaAfterPrefix(
    const std::string& new_text) const {
  if (StartsWith(new_text, prefix_text_)) {
    return new_text.substr(prefix_text_.size());
  }
  // Only for an invalid byte-fallback run (see the header): emit what
  // follows the common prefix, from a character boundary.
  size_t common = 0;
  while (common < prefix_text_.size() && common < new_text.size() &&
         prefix_text_[common] == new_text[common]) {
    ++common;
  }
  while (common > 0 &&
         (static_cast<unsigned char>(new_text[common]) & 0xC0) == 0x80) {
    --common;
  }
  return new_text.substr(common);
}

std::string IncrementalDetokenizer::Emit(const std::string& new_text) {
  std::string delta = DeltaAfterPrefix(new_text);
  // Slide the window: the new prefix is the part just emitted, unless its
  // text alone is empty (then keep the older, non-empty prefix).
  auto tail = DecodeFrom(read_offset_);
  if (tail.ok() && !tail->empty() &&
      !StartsWith(*tail, std::string(tok::kReplacementUtf8))) {
    prefix_offset_ = read_offset_;
    prefix_text_ = *std::move(tail);
  } else {
    prefix_text_ = new_text;
  }
  read_offset_ = ids_.size();
  return delta;
}

absl::StatusOr<std::string> IncrementalDetokenizer::Add(int32_t id) {
  RETURN_IF_ERROR(CheckTokenId(tok_, id));
  ids_.push_back(id);
  ASSIGN_OR_RETURN(std::string new_text, DecodeFrom(prefix_offset_));
  if (new_text.size() <= prefix_text_.size() || EndsWithReplacement(new_text)) {
    return std::string();
  }
  return Emit(new_text);
}

absl::StatusOr<std::string> IncrementalDetokenizer::Peek(int32_t id) const {
  RETURN_IF_ERROR(CheckTokenId(tok_, id));
  std::vector<int32_t> window(ids_.begin() + prefix_offset_, ids_.end());
  window.push_back(id);
  ASSIGN_OR_RETURN(std::string new_text, tok_.Decode(window, skip_special_));
  if (new_text.size() <= prefix_text_.size() || EndsWithReplacement(new_text)) {
    return std::string();
  }
  return DeltaAfterPrefix(new_text);
}

std::string IncrementalDetokenizer::Flush() {
  if (read_offset_ == ids_.size()) return std::string();
  auto new_text = DecodeFrom(prefix_offset_);
  if (!new_text.ok() || new_text->size() <= prefix_text_.size()) {
    read_offset_ = ids_.size();
    return std::string();
  }
  return Emit(*new_text);
}

}  // namespace pdserve
