// `pdserve bench-tokenizer`: single-threaded encode throughput (MB/s and
// tokens/s) of a tokenizer.json over a text file, line by line (each line is
// one Encode call, like one prompt). Without --file it builds a deterministic
// mixed corpus (prose, code, numbers, CJK, emoji) from the tokenizer
// reference strings and the repository's own sources and docs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/common_flags.h"
#include "tools/subcommand.h"

ABSL_FLAG(std::string, file, "",
          "bench-tokenizer: text file to encode line by line (default: a "
          "generated mixed corpus)");
ABSL_FLAG(int32_t, corpus_mb, 4,
          "bench-tokenizer: size of the generated corpus in MiB");
ABSL_FLAG(std::string, write_corpus, "",
          "bench-tokenizer: also write the generated corpus to this file");
ABSL_FLAG(int32_t, passes, 2,
          "bench-tokenizer: passes over the text (the first fills the word "
          "cache)");
ABSL_FLAG(bool, word_cache, true, "bench-tokenizer: use the BPE word cache");

namespace pdserve {
namespace {

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Deterministic mixed text: reference strings (many scripts and emoji),
// repository sources (code) and docs (English prose), and numbers.
std::string MakeCorpus(size_t bytes) {
  std::vector<std::string> refs, pieces;
  for (const char* name : {"llama2", "gpt2", "falcon"}) {
    std::ifstream in(std::string("tests/data/tokenizers/") + name +
                     "/reference.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      try {
        refs.push_back(nlohmann::json::parse(line).at("text"));
      } catch (const nlohmann::json::exception&) {
      }
    }
  }
  std::error_code ec;
  for (const char* dir : {"common", "docs", "tools"}) {
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator();
         it.increment(ec)) {
      const auto ext = it->path().extension();
      if (ext != ".cc" && ext != ".h" && ext != ".md") continue;
      for (auto line : absl::StrSplit(ReadAll(it->path()), '\n')) {
        if (!line.empty()) pieces.emplace_back(line);
      }
    }
  }
  std::sort(pieces.begin(), pieces.end());  // directory order is not stable
  std::mt19937 rng(2024);
  std::string out;
  while (out.size() < bytes && !pieces.empty() && !refs.empty()) {
    // A "prompt": a few pieces on one line (40% reference strings, 60%
    // code/prose lines), sometimes with numbers.
    const int n = 1 + rng() % 6;
    for (int k = 0; k < n; ++k) {
      out += rng() % 10 < 4 ? refs[rng() % refs.size()]
                            : pieces[rng() % pieces.size()];
      out += ' ';
      if (rng() % 5 == 0) out += std::to_string(rng() % 1000000) + ", ";
    }
    out += '\n';
  }
  return out;
}

int RunBenchTokenizer(const std::vector<std::string>& args) {
  std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) path = absl::GetFlag(FLAGS_model);
  TokenizerOptions options;
  options.word_cache = absl::GetFlag(FLAGS_word_cache);
  auto tok = Tokenizer::Load(path, options);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::string text;
  if (absl::GetFlag(FLAGS_file).empty()) {
    text =
        MakeCorpus(static_cast<size_t>(absl::GetFlag(FLAGS_corpus_mb)) << 20);
    std::printf("corpus: generated, %zu bytes\n", text.size());
    if (!absl::GetFlag(FLAGS_write_corpus).empty()) {
      std::ofstream(absl::GetFlag(FLAGS_write_corpus), std::ios::binary)
          << text;
    }
  } else {
    text = ReadAll(absl::GetFlag(FLAGS_file));
    std::printf("corpus: %s, %zu bytes\n", absl::GetFlag(FLAGS_file).c_str(),
                text.size());
  }
  std::vector<std::string_view> lines;
  for (auto line : absl::StrSplit(text, '\n')) {
    if (!line.empty()) lines.emplace_back(line.data(), line.size());
  }
  using Clock = std::chrono::steady_clock;
  for (int pass = 1; pass <= absl::GetFlag(FLAGS_passes); ++pass) {
    size_t bytes = 0, tokens = 0, errors = 0;
    const auto start = Clock::now();
    auto last_progress = start;
    for (size_t i = 0; i < lines.size(); ++i) {
      auto ids = (*tok)->Encode(lines[i], /*add_special_tokens=*/false);
      bytes += lines[i].size();
      if (ids.ok()) {
        tokens += ids->size();
      } else {
        ++errors;
      }
      const auto now = Clock::now();
      if (now - last_progress > std::chrono::seconds(2)) {
        std::fprintf(stderr, "  pass %d: %zu/%zu lines\n", pass, i + 1,
                     lines.size());
        last_progress = now;
      }
    }
    const double s =
        std::chrono::duration<double>(Clock::now() - start).count();
    std::printf(
        "pass %d: %.2f MB/s, %.0f tokens/s (%zu bytes, %zu lines, %zu tokens, "
        "%.2f bytes/token, %zu rejected, %.3f s, word cache %s)\n",
        pass, bytes / s / 1e6, tokens / s, bytes, lines.size(), tokens,
        tokens ? static_cast<double>(bytes) / tokens : 0.0, errors, s,
        options.word_cache ? "on" : "off");
  }
  return 0;
}

PDSERVE_SUBCOMMAND(
    "bench-tokenizer", "single-threaded tokenizer encode throughput",
    "pdserve bench-tokenizer --tokenizer=PATH [--file=TEXT] [--corpus_mb=4] "
    "[--write_corpus=PATH] [--passes=2] [--word_cache=false]",
    FlagNames({{"model", "tokenizer"}}), RunBenchTokenizer);

}  // namespace
}  // namespace pdserve
