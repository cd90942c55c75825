#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/unicode.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token named in tokenizer_config.json: "<s>" or {"content": ...}.
std::optional<std::string> ConfigToken(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) {
    return it->at("content").get<std::string>();
  }
  return std::nullopt;
}

bool IsNull(const json& j, const char* key) {
  return !j.contains(key) || j.at(key).is_null();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(
    const std::string& path, const TokenizerOptions& options) {
  std::filesystem::path json_path(path);
  std::error_code ec;
  if (std::filesystem::is_directory(json_path, ec)) {
    json_path /= "tokenizer.json";
    if (!std::filesystem::exists(json_path, ec)) {
      return absl::NotFoundError(
          absl::StrCat("'", path,
                       "' has no tokenizer.json (the Hugging Face tokenizer "
                       "file this needs)"));
    }
  } else if (!std::filesystem::exists(json_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no such file or directory: '", path,
                     "' (give a tokenizer.json or the model directory "
                     "holding one)"));
  }
  ASSIGN_OR_RETURN(std::string json_text, ReadFile(json_path));
  std::string config_text;
  const auto config_path = json_path.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(config_text, ReadFile(config_path));
  }
  auto tokenizer = std::make_unique<Tokenizer>();
  absl::Status status;
  try {
    status = tokenizer->Init(json_text, config_text, options);
  } catch (const json::exception& e) {
    status = absl::InvalidArgumentError(
        absl::StrCat("malformed tokenizer files: ", e.what()));
  }
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(json_path.string(), ": ",
                                                    status.message()));
  }
  return tokenizer;
}

absl::Status Tokenizer::Init(const std::string& json_text,
                             const std::string& config_text,
                             const TokenizerOptions& options) {
  const json j = json::parse(json_text);
  if (!j.is_object() || !j.contains("model")) {
    return absl::InvalidArgumentError("not a tokenizer.json (no \"model\")");
  }
  ASSIGN_OR_RETURN(model_,
                   tok::BpeModel::FromJson(j.at("model"), options.word_cache));
  if (!IsNull(j, "normalizer")) {
    ASSIGN_OR_RETURN(normalizer_, tok::MakeNormalizer(j.at("normalizer")));
  }
  if (!IsNull(j, "pre_tokenizer")) {
    ASSIGN_OR_RETURN(pre_tokenizer_,
                     tok::MakePreTokenizer(j.at("pre_tokenizer")));
  }
  if (!IsNull(j, "post_processor")) {
    ASSIGN_OR_RETURN(post_processor_,
                     tok::MakePostProcessor(j.at("post_processor")));
  }
  if (!IsNull(j, "decoder")) {
    ASSIGN_OR_RETURN(decoder_, tok::MakeDecoder(j.at("decoder")));
  }

  std::vector<tok::AddedToken> added;
  vocab_size_ = model_->id_limit();
  if (!IsNull(j, "added_tokens")) {
    for (const auto& t : j.at("added_tokens")) {
      tok::AddedToken a;
      a.content = t.at("content").get<std::string>();
      const int64_t id = t.at("id").get<int64_t>();
      if (id < 0 || id > (1 << 30)) {
        return absl::InvalidArgumentError(
            absl::StrCat("added token id ", id, " out of range"));
      }
      a.id = static_cast<int32_t>(id);
      a.single_word = tok::JsonOr(t, "single_word", false);
      a.lstrip = tok::JsonOr(t, "lstrip", false);
      a.rstrip = tok::JsonOr(t, "rstrip", false);
      a.normalized = tok::JsonOr(t, "normalized", false);
      a.special = tok::JsonOr(t, "special", false);
      if (a.special) special_contents_.insert(a.content);
      vocab_size_ = std::max(vocab_size_, a.id + 1);
      added.push_back(std::move(a));
    }
  }
  added_.Build(std::move(added), normalizer_.get());

  json config = json::object();
  if (!config_text.empty()) {
    config = json::parse(config_text);
    if (!config.is_object()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json is not an object");
    }
  }
  auto lookup = [&](const std::optional<std::string>& token) {
    return token ? TokenToId(*token) : std::nullopt;
  };
  bos_id_ = lookup(ConfigToken(config, "bos_token"));
  eos_id_ = lookup(ConfigToken(config, "eos_token"));
  if (!bos_id_) bos_id_ = lookup("<s>");
  if (!eos_id_) eos_id_ = lookup("</s>");
  if (!eos_id_) eos_id_ = lookup("<|endoftext|>");
  if (!post_processor_) {
    using Piece = tok::PostProcessor::Piece;
    std::vector<Piece> single;
    if (tok::JsonOr(config, "add_bos_token", false) && bos_id_) {
      single.emplace_back(std::vector<int32_t>{*bos_id_});
    }
    single.emplace_back(std::monostate{});
    if (tok::JsonOr(config, "add_eos_token", false) && eos_id_) {
      single.emplace_back(std::vector<int32_t>{*eos_id_});
    }
    if (single.size() > 1) {
      post_processor_ = std::make_unique<tok::PostProcessor>(std::move(single));
    }
  }
  return absl::OkStatus();
}

void Tokenizer::EncodeText(std::string_view segment, bool at_input_start,
                           std::vector<int32_t>* ids) const {
  std::string normalized(segment);
  if (normalizer_) normalizer_->Normalize(&normalized);
  std::vector<tok::AddedVocabulary::Segment> parts;
  added_.Split(normalized, /*normalized_tokens=*/true, &parts);
  std::vector<tok::PreToken> pieces;
  for (const auto& part : parts) {
    if (part.id >= 0) {
      ids->push_back(part.id);
      continue;
    }
    pieces.clear();
    pieces.push_back({normalized.substr(part.begin, part.end - part.begin),
                      at_input_start && part.begin == 0});
    if (pre_tokenizer_) pre_tokenizer_->PreTokenize(&pieces);
    for (const auto& piece : pieces) model_->Tokenize(piece.text, ids);
  }
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(
    std::string_view text, bool add_special_tokens) const {
  if (const size_t bad = tok::FindInvalidUtf8(text);
      bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid UTF-8 at byte ", bad, " of the input text"));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<tok::AddedVocabulary::Segment> segments;
  added_.Split(text, /*normalized_tokens=*/false, &segments);
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      EncodeText(text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0,
                 &ids);
    }
  }
  if (add_special_tokens && post_processor_) {
    return post_processor_->Apply(ids);
  }
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " is out of range [0, ", vocab_size_, ")"));
    }
    const std::string* token = nullptr;
    if (const tok::AddedToken* added = added_.FindById(id)) {
      token = &added->content;
    } else {
      token = model_->IdToToken(id);
    }
    if (token == nullptr) continue;
    if (skip_special_tokens &&
        special_contents_.contains(absl::string_view(*token))) {
      continue;
    }
    tokens.push_back(*token);
  }
  std::string out;
  if (decoder_) {
    decoder_->DecodeChain(&tokens);
    for (const auto& t : tokens) out.append(t);
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out.append(tokens[i]);
    }
  }
  return out;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const tok::AddedToken* added = added_.FindById(id);
  return added != nullptr && added->special;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto id = added_.FindByContent(token)) return id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (const tok::AddedToken* added = added_.FindById(id)) {
    return added->content;
  }
  if (const std::string* token = model_->IdToToken(id)) return *token;
  return std::nullopt;
}

}  // namespace pdserve
