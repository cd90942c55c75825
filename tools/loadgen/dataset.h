// Benchmark datasets: the list of requests `pdserve bench` sends. Prompts are
// synthetic token ids (drawn from a safe id range of the served model's
// vocabulary) or text/ids read from a JSONL file. Pure functions, no state.
#ifndef PDSERVE_TOOLS_LOADGEN_DATASET_H_
#define PDSERVE_TOOLS_LOADGEN_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::loadgen {

// One request of a benchmark. Exactly one of `prompt_text` / `prompt_ids` is
// used: ids when non-empty, text otherwise.
struct BenchRequest {
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  int32_t max_tokens = 0;
  // Prompt length in tokens as far as the bench knows it (ids: exact; text:
  // 0 until the server reports usage).
  int32_t input_tokens = 0;
  bool is_long = false;  // `mixed`: drawn from the long class
};

enum class DatasetKind { kRandom, kFixed, kPrefix, kMixed, kFile };

absl::StatusOr<DatasetKind> ParseDatasetKind(const std::string& name);
std::string DatasetKindName(DatasetKind kind);

struct DatasetOptions {
  DatasetKind kind = DatasetKind::kRandom;
  int32_t num_prompts = 100;
  int32_t input_len = 128;  // prompt tokens (short class for `mixed`)
  int32_t output_len = 64;  // max_tokens of each request
  // Lengths are uniform in [len * (1 - r), len * (1 + r)] (at least 1);
  // applies to random, prefix (suffix part) and mixed (both classes).
  double range_ratio = 0.0;
  int32_t prefix_len = 64;        // `prefix`: shared prefix tokens
  int32_t num_prefixes = 4;       // `prefix`: distinct shared prefixes
  double long_fraction = 0.1;     // `mixed`: fraction of long prompts
  int32_t long_input_len = 1024;  // `mixed`: long prompt tokens
  std::string file;               // `file`: JSONL path
  // Synthetic token ids are drawn uniformly from [token_lo, token_hi).
  int32_t token_lo = 3;
  int32_t token_hi = 512;
  uint64_t seed = 0;
};

// Picks a token-id range for synthetic prompts that avoids the low ids
// (special and byte tokens) and the top of the vocabulary (where newer
// tokenizers keep their added special tokens).
void SafeTokenRange(int32_t vocab_size, int32_t* lo, int32_t* hi);

// Builds the dataset; deterministic for a given options.seed.
absl::StatusOr<std::vector<BenchRequest>> BuildDataset(
    const DatasetOptions& options);

// Parses JSONL text: one object per line with "prompt" (text) or
// "prompt_ids" (array of ints) and optional "max_tokens" (default
// `default_max_tokens`). Blank lines are skipped. Errors name the line.
absl::StatusOr<std::vector<BenchRequest>> ParseDatasetJsonl(
    const std::string& text, int32_t default_max_tokens);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_TOOLS_LOADGEN_DATASET_H_
