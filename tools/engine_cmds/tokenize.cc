// `pdserve tokenize`: encode text, decode ids, or run a JSONL file through a
// Hugging Face tokenizer.json (the format of tests/data/tokenizers/*/
// reference.jsonl, so the output can be diffed against the references).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/common_flags.h"
#include "tools/subcommand.h"

ABSL_FLAG(bool, add_special_tokens, false,
          "tokenize: apply the post-processor (e.g. add <s>)");
ABSL_FLAG(std::vector<std::string>, decode_ids, {},
          "decode these comma-separated token ids instead of encoding TEXT");
ABSL_FLAG(bool, skip_special_tokens, false,
          "--decode_ids: leave special tokens out of the text");

namespace pdserve {
namespace {

using nlohmann::json;

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromFlags() {
  std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) path = absl::GetFlag(FLAGS_model);
  return Tokenizer::Load(path);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "pdserve tokenize: %s\n", status.ToString().c_str());
  return 1;
}

// One {"text": ...} line -> {"ids_no_special", "ids_with_special", "decoded"}.
absl::StatusOr<json> ProcessLine(const Tokenizer& tok,
                                 const std::string& line) {
  json in;
  try {
    in = json::parse(line);
    if (!in.is_object() || !in.contains("text") || !in["text"].is_string()) {
      return absl::InvalidArgumentError("expected {\"text\": \"...\"}");
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad JSON: ", e.what()));
  }
  const std::string text = in["text"].get<std::string>();
  ASSIGN_OR_RETURN(auto no_special, tok.Encode(text, false));
  ASSIGN_OR_RETURN(auto with_special, tok.Encode(text, true));
  ASSIGN_OR_RETURN(std::string decoded, tok.Decode(no_special, true));
  return json{{"ids_no_special", no_special},
              {"ids_with_special", with_special},
              {"decoded", decoded}};
}

int RunJsonl(const Tokenizer& tok, const std::string& path) {
  std::ifstream in(path);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot open ", path)));
  std::string line;
  int line_no = 0, errors = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    auto out = ProcessLine(tok, line);
    if (!out.ok()) {
      ++errors;
      std::fprintf(stderr, "%s:%d: %s\n", path.c_str(), line_no,
                   out.status().ToString().c_str());
      std::printf(
          "%s\n",
          json{{"error", std::string(out.status().message())}}.dump().c_str());
      continue;
    }
    std::printf("%s\n", out->dump().c_str());
  }
  return errors == 0 ? 0 : 1;
}

int RunTokenize(const std::vector<std::string>& args) {
  auto tok_or = LoadFromFlags();
  if (!tok_or.ok()) return Fail(tok_or.status());
  const Tokenizer& tok = **tok_or;
  const bool as_json = absl::GetFlag(FLAGS_json);

  if (!absl::GetFlag(FLAGS_input_jsonl).empty()) {
    return RunJsonl(tok, absl::GetFlag(FLAGS_input_jsonl));
  }
  if (!absl::GetFlag(FLAGS_decode_ids).empty()) {
    std::vector<int32_t> ids;
    for (const std::string& s : absl::GetFlag(FLAGS_decode_ids)) {
      int32_t id;
      if (!absl::SimpleAtoi(s, &id)) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("--decode_ids: '", s, "' is not a token id")));
      }
      ids.push_back(id);
    }
    auto text = tok.Decode(ids, absl::GetFlag(FLAGS_skip_special_tokens));
    if (!text.ok()) return Fail(text.status());
    if (as_json) {
      std::printf("%s\n", json{{"ids", ids}, {"text", *text}}.dump().c_str());
    } else {
      std::printf("%s\n", text->c_str());
    }
    return 0;
  }
  if (args.size() < 2) {
    return Fail(absl::InvalidArgumentError(
        "give TEXT, --decode_ids=IDS or --input_jsonl=FILE"));
  }
  const std::string text = absl::StrJoin(
      std::vector<std::string>(args.begin() + 1, args.end()), " ");
  auto ids = tok.Encode(text, absl::GetFlag(FLAGS_add_special_tokens));
  if (!ids.ok()) return Fail(ids.status());
  if (as_json) {
    std::vector<std::string> tokens;
    for (int32_t id : *ids) tokens.push_back(tok.IdToToken(id).value_or(""));
    std::printf("%s\n", json{{"ids", *ids}, {"tokens", tokens}}.dump().c_str());
  } else {
    std::printf("%s\n", absl::StrJoin(*ids, ",").c_str());
  }
  return 0;
}

PDSERVE_SUBCOMMAND(
    "tokenize", "encode text / decode ids with a tokenizer.json",
    "pdserve tokenize --tokenizer=DIR_or_tokenizer.json [--add_special_tokens] "
    "[--json] TEXT\n"
    "pdserve tokenize --tokenizer=... --decode_ids=1,2,3 "
    "[--skip_special_tokens] "
    "[--json]\n"
    "pdserve tokenize --tokenizer=... --input_jsonl=FILE   ({\"text\": ...} "
    "per line -> {\"ids_no_special\", \"ids_with_special\", \"decoded\"})\n"
    "--tokenizer defaults to the --model directory.",
    FlagNames({{"model", "tokenizer", "input_jsonl", "json"}}), RunTokenize);

}  // namespace
}  // namespace pdserve
