#include "common/tokenizer/post_processor.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/json_util.h"
#include "common/util/status_macros.h"

namespace pdserve::tok {
namespace {

using Template = std::vector<PostProcessor::Piece>;

absl::StatusOr<Template> ParseTemplate(const nlohmann::json& j) {
  const auto& special = j.contains("special_tokens") ? j.at("special_tokens")
                                                     : nlohmann::json::object();
  const auto& single = j.at("single");
  if (single.is_string()) {
    return absl::InvalidArgumentError(
        "TemplateProcessing with a string template is not supported");
  }
  Template out;
  for (const auto& piece : single) {
    if (piece.contains("Sequence")) {
      out.emplace_back(std::monostate{});
    } else if (piece.contains("SpecialToken")) {
      const std::string id =
          piece.at("SpecialToken").at("id").get<std::string>();
      if (!special.contains(id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "TemplateProcessing: special token \"", id, "\" has no ids"));
      }
      out.emplace_back(special.at(id).at("ids").get<std::vector<int32_t>>());
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("TemplateProcessing: bad piece ", piece.dump()));
    }
  }
  return out;
}

// BertProcessing / RobertaProcessing: cls A sep, with ["token", id] pairs.
Template ClsSepTemplate(const nlohmann::json& j) {
  return {std::vector<int32_t>{j.at("cls").at(1).get<int32_t>()},
          std::monostate{},
          std::vector<int32_t>{j.at("sep").at(1).get<int32_t>()}};
}

// Composes `outer` around `inner`: the sequence slot of `outer` receives
// the whole of `inner`.
Template Compose(const Template& inner, const Template& outer) {
  Template out;
  for (const auto& p : outer) {
    if (std::holds_alternative<std::monostate>(p)) {
      out.insert(out.end(), inner.begin(), inner.end());
    } else {
      out.push_back(p);
    }
  }
  return out;
}

absl::StatusOr<Template> MakeTemplate(const nlohmann::json& j) {
  const std::string type = JsonType(j);
  if (type == "TemplateProcessing") return ParseTemplate(j);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    return ClsSepTemplate(j);
  }
  if (type == "ByteLevel") return Template{std::monostate{}};
  if (type == "Sequence") {
    Template t{std::monostate{}};
    for (const auto& item : j.at("processors")) {
      ASSIGN_OR_RETURN(Template next, MakeTemplate(item));
      t = Compose(t, next);
    }
    return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported post_processor type \"", type, "\""));
}

}  // namespace

std::vector<int32_t> PostProcessor::Apply(
    const std::vector<int32_t>& ids) const {
  std::vector<int32_t> out;
  out.reserve(ids.size() + 4);
  for (const auto& p : single_) {
    if (std::holds_alternative<std::monostate>(p)) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      const auto& special = std::get<std::vector<int32_t>>(p);
      out.insert(out.end(), special.begin(), special.end());
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(
    const nlohmann::json& j) {
  ASSIGN_OR_RETURN(Template t, MakeTemplate(j));
  return std::make_unique<PostProcessor>(std::move(t));
}

}  // namespace pdserve::tok
