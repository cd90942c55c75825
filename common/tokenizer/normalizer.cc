#include "common/tokenizer/normalizer.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode.h"
#include "common/util/status_macros.h"

namespace pdserve::tok {
namespace {

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  void Normalize(std::string* text) const override {
    // Pure ASCII is invariant under every normal form.
    for (unsigned char c : *text) {
      if (c >= 0x80) {
        *text = NormalizeUnicode(*text, form_);
        return;
      }
    }
  }

 private:
  NormalForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override { *text = Lowercase(*text); }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      size_t i = 0;
      while (i < end) {
        size_t next = i;
        if (!IsWhitespace(NextCodePoint(*text, &next))) break;
        i = next;
      }
      begin = i;
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin &&
               (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) {
          --start;
        }
        size_t next = start;
        if (!IsWhitespace(NextCodePoint(*text, &next))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    *text = pattern_->ReplaceAll(*text, content_);
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void Normalize(std::string* text) const override {
    for (const auto& p : parts_) p->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(
    const nlohmann::json& j) {
  const std::string type = JsonType(j);
  if (type == "NFC")
    return std::make_unique<UnicodeNormalizer>(NormalForm::kNfc);
  if (type == "NFD")
    return std::make_unique<UnicodeNormalizer>(NormalForm::kNfd);
  if (type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkc);
  }
  if (type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkd);
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(JsonOr(j, "strip_left", true),
                                             JsonOr(j, "strip_right", true));
  }
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(
        j.at("prepend").get<std::string>());
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, MakePattern(j.at("pattern")));
    return std::make_unique<ReplaceNormalizer>(
        std::move(pattern), j.at("content").get<std::string>());
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& item : j.at("normalizers")) {
      ASSIGN_OR_RETURN(auto part, MakeNormalizer(item));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported normalizer type \"", type, "\""));
}

}  // namespace pdserve::tok
