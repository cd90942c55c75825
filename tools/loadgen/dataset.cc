#include "tools/loadgen/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve::loadgen {
namespace {

int32_t DrawLength(int32_t len, double range_ratio, std::mt19937_64& rng) {
  if (range_ratio <= 0.0) return std::max(1, len);
  const int32_t lo = std::max<int32_t>(
      1, static_cast<int32_t>(std::floor(len * (1.0 - range_ratio))));
  const int32_t hi = std::max<int32_t>(
      lo, static_cast<int32_t>(std::ceil(len * (1.0 + range_ratio))));
  return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
}

std::vector<int32_t> DrawTokens(int32_t n, const DatasetOptions& o,
                                std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> dist(o.token_lo, o.token_hi - 1);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = dist(rng);
  return ids;
}

BenchRequest IdsRequest(std::vector<int32_t> ids, int32_t max_tokens) {
  BenchRequest r;
  r.input_tokens = static_cast<int32_t>(ids.size());
  r.prompt_ids = std::move(ids);
  r.max_tokens = max_tokens;
  return r;
}

absl::StatusOr<std::vector<BenchRequest>> LoadFile(const DatasetOptions& o) {
  std::ifstream in(o.file);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read dataset file ", o.file));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  ASSIGN_OR_RETURN(std::vector<BenchRequest> lines,
                   ParseDatasetJsonl(ss.str(), o.output_len));
  if (lines.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset file ", o.file, " has no requests"));
  }
  // Cycle through the file until num_prompts requests.
  std::vector<BenchRequest> out;
  out.reserve(o.num_prompts);
  for (int32_t i = 0; i < o.num_prompts; ++i) {
    out.push_back(lines[i % lines.size()]);
  }
  return out;
}

}  // namespace

absl::StatusOr<DatasetKind> ParseDatasetKind(const std::string& name) {
  if (name == "random") return DatasetKind::kRandom;
  if (name == "fixed") return DatasetKind::kFixed;
  if (name == "prefix") return DatasetKind::kPrefix;
  if (name == "mixed") return DatasetKind::kMixed;
  if (name == "file") return DatasetKind::kFile;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dataset '", name, "' (random, fixed, prefix, mixed, file)"));
}

std::string DatasetKindName(DatasetKind kind) {
  switch (kind) {
    case DatasetKind::kRandom:
      return "random";
    case DatasetKind::kFixed:
      return "fixed";
    case DatasetKind::kPrefix:
      return "prefix";
    case DatasetKind::kMixed:
      return "mixed";
    case DatasetKind::kFile:
      return "file";
  }
  return "?";
}

void SafeTokenRange(int32_t vocab_size, int32_t* lo, int32_t* hi) {
  // Skip ids below min(100, vocab/4) and the top 1/16 of the vocabulary.
  *lo = std::min<int32_t>(100, vocab_size / 4);
  *hi = std::max<int32_t>(*lo + 1, vocab_size - vocab_size / 16);
}

absl::StatusOr<std::vector<BenchRequest>> BuildDataset(
    const DatasetOptions& o) {
  if (o.num_prompts <= 0) {
    return absl::InvalidArgumentError("--num_prompts must be positive");
  }
  if (o.kind == DatasetKind::kFile) return LoadFile(o);
  if (o.token_lo < 0 || o.token_hi <= o.token_lo) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad token id range [", o.token_lo, ", ", o.token_hi, ")"));
  }
  if (o.input_len <= 0 || o.output_len <= 0) {
    return absl::InvalidArgumentError(
        "--input_len and --output_len must be positive");
  }
  if (o.range_ratio < 0.0 || o.range_ratio >= 1.0) {
    return absl::InvalidArgumentError("--range_ratio must be in [0, 1)");
  }
  std::mt19937_64 rng(o.seed);
  std::vector<BenchRequest> out;
  out.reserve(o.num_prompts);
  switch (o.kind) {
    case DatasetKind::kFixed:
      for (int32_t i = 0; i < o.num_prompts; ++i) {
        out.push_back(
            IdsRequest(DrawTokens(o.input_len, o, rng), o.output_len));
      }
      break;
    case DatasetKind::kRandom:
      for (int32_t i = 0; i < o.num_prompts; ++i) {
        const int32_t in_len = DrawLength(o.input_len, o.range_ratio, rng);
        const int32_t out_len = DrawLength(o.output_len, o.range_ratio, rng);
        out.push_back(IdsRequest(DrawTokens(in_len, o, rng), out_len));
      }
      break;
    case DatasetKind::kPrefix: {
      if (o.num_prefixes <= 0 || o.prefix_len <= 0) {
        return absl::InvalidArgumentError(
            "--num_prefixes and --prefix_len must be positive");
      }
      std::vector<std::vector<int32_t>> prefixes;
      for (int32_t p = 0; p < o.num_prefixes; ++p) {
        prefixes.push_back(DrawTokens(o.prefix_len, o, rng));
      }
      for (int32_t i = 0; i < o.num_prompts; ++i) {
        std::vector<int32_t> ids = prefixes[i % o.num_prefixes];
        const int32_t suffix = DrawLength(o.input_len, o.range_ratio, rng);
        std::vector<int32_t> tail = DrawTokens(suffix, o, rng);
        ids.insert(ids.end(), tail.begin(), tail.end());
        out.push_back(IdsRequest(std::move(ids), o.output_len));
      }
      break;
    }
    case DatasetKind::kMixed: {
      if (o.long_fraction < 0.0 || o.long_fraction > 1.0) {
        return absl::InvalidArgumentError("--long_fraction must be in [0, 1]");
      }
      if (o.long_input_len <= 0) {
        return absl::InvalidArgumentError("--long_input_len must be positive");
      }
      std::bernoulli_distribution is_long(o.long_fraction);
      for (int32_t i = 0; i < o.num_prompts; ++i) {
        const bool long_prompt = is_long(rng);
        const int32_t in_len = DrawLength(
            long_prompt ? o.long_input_len : o.input_len, o.range_ratio, rng);
        BenchRequest r = IdsRequest(DrawTokens(in_len, o, rng), o.output_len);
        r.is_long = long_prompt;
        out.push_back(std::move(r));
      }
      break;
    }
    case DatasetKind::kFile:
      break;  // handled above
  }
  return out;
}

absl::StatusOr<std::vector<BenchRequest>> ParseDatasetJsonl(
    const std::string& text, int32_t default_max_tokens) {
  std::vector<BenchRequest> out;
  std::istringstream lines(text);
  std::string line;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    BenchRequest r;
    r.max_tokens = default_max_tokens;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!j.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_no, ": not a JSON object"));
      }
      if (j.contains("prompt_ids")) {
        r.prompt_ids = j.at("prompt_ids").get<std::vector<int32_t>>();
        r.input_tokens = static_cast<int32_t>(r.prompt_ids.size());
      } else if (j.contains("prompt")) {
        r.prompt_text = j.at("prompt").get<std::string>();
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", line_no, ": needs \"prompt\" or \"prompt_ids\""));
      }
      if (j.contains("max_tokens")) {
        r.max_tokens = j.at("max_tokens").get<int32_t>();
      }
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": ", e.what()));
    }
    if (r.prompt_ids.empty() && r.prompt_text.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": empty prompt"));
    }
    if (r.max_tokens <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": max_tokens must be positive"));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace pdserve::loadgen
