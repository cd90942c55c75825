#include "common/tokenizer/decoder.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode.h"
#include "common/util/status_macros.h"

namespace pdserve::tok {
namespace {

// Maps byte-level chars back to bytes; a token with any other char is taken
// as raw UTF-8. The whole output is decoded lossily (U+FFFD).
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& t : *tokens) {
      const size_t mark = bytes.size();
      size_t i = 0;
      bool ok = true;
      while (i < t.size()) {
        const int b = ByteLevelCharToByte(NextCodePoint(t, &i));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!ok) {
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    tokens->assign(1, Utf8Lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) t = pattern_->ReplaceAll(t, content_);
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xNN>" tokens become bytes; a run that is not valid UTF-8 becomes one
// U+FFFD per byte (HF semantics).
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      if (FindInvalidUtf8(run) == std::string::npos) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run.size(); ++k) {
          out.emplace_back(kReplacementUtf8);
        }
      }
      run.clear();
    };
    for (auto& t : *tokens) {
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
          HexValue(t[3]) >= 0 && HexValue(t[4]) >= 0) {
        run.push_back(static_cast<char>(HexValue(t[3]) * 16 + HexValue(t[4])));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all.append(t);
    tokens->assign(1, std::move(all));
  }
};

// Strips up to `start` leading and `stop` trailing `content` chars from each
// token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      size_t begin = 0;
      for (size_t n = 0; n < start_ && begin < t.size(); ++n) {
        size_t next = begin;
        if (NextCodePoint(t, &next) != content_) break;
        begin = next;
      }
      size_t end = t.size();
      for (size_t n = 0; n < stop_ && end > begin; ++n) {
        size_t s = end - 1;
        while (s > begin && (static_cast<unsigned char>(t[s]) & 0xC0) == 0x80) {
          --s;
        }
        size_t next = s;
        if (NextCodePoint(t, &next) != content_) break;
        end = s;
      }
      t = t.substr(begin, end - begin);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, PrependScheme scheme)
      : replacement_(replacement), scheme_(scheme) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t k = 0; k < tokens->size(); ++k) {
      const std::string& t = (*tokens)[k];
      std::string out;
      out.reserve(t.size());
      size_t i = 0;
      while (i < t.size()) {
        const size_t b = i;
        const char32_t c = NextCodePoint(t, &i);
        if (c == replacement_) {
          if (!(k == 0 && scheme_ != PrependScheme::kNever)) out.push_back(' ');
        } else {
          out.append(t, b, i - b);
        }
      }
      (*tokens)[k] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  PrependScheme scheme_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& p : parts_) p->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const nlohmann::json& j) {
  const std::string type = JsonType(j);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, MakePattern(j.at("pattern")));
    return std::make_unique<ReplaceDecoder>(std::move(pattern),
                                            j.at("content").get<std::string>());
  }
  if (type == "Strip") {
    ASSIGN_OR_RETURN(char32_t content,
                     SingleChar(j.at("content").get<std::string>(),
                                "Strip decoder content"));
    return std::make_unique<StripDecoder>(content, j.at("start").get<size_t>(),
                                          j.at("stop").get<size_t>());
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(char32_t replacement,
                     SingleChar(JsonOr<std::string>(j, "replacement", "\u2581"),
                                "Metaspace replacement"));
    ASSIGN_OR_RETURN(auto scheme, ParsePrependScheme(j));
    return std::make_unique<MetaspaceDecoder>(replacement, scheme);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& item : j.at("decoders")) {
      ASSIGN_OR_RETURN(auto part, MakeDecoder(item));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported decoder type \"", type, "\""));
}

}  // namespace pdserve::tok
