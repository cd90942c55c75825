// `pdserve complete`: runs the engine in-process on prompt ids (one from
// --prompt_ids, or one request per line of --input_jsonl, all run
// concurrently in one continuously batched GenerationScheduler) and prints
// the generated ids (one JSON line per request with --json / --input_jsonl).
// A positional TEXT prompt is tokenized with the model directory's tokenizer
// (or --tokenizer), special tokens (BOS) per its post-processor; when a
// tokenizer is available the output also carries `text`.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine.h"
#include "common/engine/scheduler.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/common_flags.h"
#include "tools/engine_flags.h"
#include "tools/logprobs_json.h"
#include "tools/subcommand.h"

namespace pdserve {
namespace {

struct CompletionResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  std::string finish_reason;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  // Entry t scores prompt token t + 1 (request.prompt_logprobs >= 0).
  std::vector<SampledToken> prompt_logprobs;
  absl::Status status;
};

absl::StatusOr<std::vector<int32_t>> ParseIds(
    const std::vector<std::string>& parts, const char* what) {
  std::vector<int32_t> ids;
  for (const std::string& p : parts) {
    int32_t id;
    if (!absl::SimpleAtoi(p, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", p, "' is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

// The request the flags describe, for `prompt_ids`. (Text prompts: tokenize,
// then call this.)
absl::StatusOr<GenerationRequest> RequestFromFlags(
    std::vector<int32_t> prompt_ids) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt_ids);
  r.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  r.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  r.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  r.sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  r.sampling.repetition_penalty =
      static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  r.sampling.presence_penalty =
      static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  r.sampling.frequency_penalty =
      static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  r.sampling.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  r.sampling.top_logprobs = absl::GetFlag(FLAGS_top_logprobs);
  r.prompt_logprobs = absl::GetFlag(FLAGS_prompt_logprobs);
  r.stop.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  r.stop.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  ASSIGN_OR_RETURN(
      r.stop.stop_token_ids,
      ParseIds(absl::GetFlag(FLAGS_stop_token_ids), "--stop_token_ids"));
  return r;
}

// One JSONL line: fields override the flags' defaults.
absl::StatusOr<GenerationRequest> RequestFromJson(const std::string& line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", e.what()));
  }
  if (!j.is_object() || !j.contains("prompt_ids") ||
      !j["prompt_ids"].is_array()) {
    return absl::InvalidArgumentError(
        "expected an object with array 'prompt_ids'");
  }
  try {
    ASSIGN_OR_RETURN(
        GenerationRequest r,
        RequestFromFlags(j["prompt_ids"].get<std::vector<int32_t>>()));
    auto num = [&](const char* key, auto* out) {
      if (j.contains(key) && !j[key].is_null()) {
        *out = j[key].get<std::remove_pointer_t<decltype(out)>>();
      }
    };
    num("max_tokens", &r.stop.max_tokens);
    num("temperature", &r.sampling.temperature);
    num("top_p", &r.sampling.top_p);
    num("top_k", &r.sampling.top_k);
    num("min_p", &r.sampling.min_p);
    num("seed", &r.sampling.seed);
    num("repetition_penalty", &r.sampling.repetition_penalty);
    num("presence_penalty", &r.sampling.presence_penalty);
    num("frequency_penalty", &r.sampling.frequency_penalty);
    num("top_logprobs", &r.sampling.top_logprobs);
    num("prompt_logprobs", &r.prompt_logprobs);
    num("ignore_eos", &r.stop.ignore_eos);
    num("min_tokens", &r.stop.min_tokens);
    num("stop_token_ids", &r.stop.stop_token_ids);
    if (j.contains("logit_bias") && !j["logit_bias"].is_null()) {
      for (const auto& [key, bias] : j["logit_bias"].items()) {
        int32_t id = 0;
        if (!absl::SimpleAtoi(key, &id)) {
          return absl::InvalidArgumentError(
              absl::StrCat("logit_bias keys must be token ids, got ", key));
        }
        r.sampling.logit_bias.emplace_back(id, bias.get<float>());
      }
      std::sort(r.sampling.logit_bias.begin(), r.sampling.logit_bias.end());
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad field: ", e.what()));
  }
}

SchedulerOptions SchedulerOptionsFromFlags() {
  SchedulerOptions so;
  so.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  so.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);
  return so;
}

// Runs every request concurrently in one scheduler; results in input order.
std::vector<CompletionResult> RunCompletions(
    Engine& engine, const std::vector<GenerationRequest>& requests) {
  std::vector<CompletionResult> results(requests.size());
  absl::Mutex mu;
  int pending = 0;
  {
    GenerationScheduler scheduler(&engine, SchedulerOptionsFromFlags());
    for (size_t i = 0; i < requests.size(); ++i) {
      results[i].prompt_ids = requests[i].prompt_ids;
      CompletionResult* result = &results[i];
      auto id = scheduler.Submit(
          requests[i], [&mu, &pending, result](const TokenEvent& e) {
            absl::MutexLock lock(&mu);
            if (!e.prompt_logprobs.empty()) {
              result->prompt_logprobs = e.prompt_logprobs;
            }
            if (e.has_token) {
              result->output_ids.push_back(e.token_id);
              result->top_logprobs.push_back(e.top_logprobs);
            }
            if (e.finished) {
              result->finish_reason = e.finish_reason;
              result->status = e.status;
              --pending;
            }
          });
      if (!id.ok()) {
        results[i].status = id.status();
        continue;
      }
      absl::MutexLock lock(&mu);
      ++pending;
    }
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* p) { return *p == 0; }, &pending));
  }
  return results;
}

// The tokenizer for text prompts and `text` output: --tokenizer, else the
// --model directory's; null when there is none (e.g. synthetic models).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer() {
  std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) {
    path = absl::GetFlag(FLAGS_model);
    if (absl::StartsWith(path, "synthetic:")) return nullptr;
  }
  return Tokenizer::Load(path);
}

// The output as the continuation of the prompt's text (what the router
// streams: IncrementalDetokenizer with the prompt as context).
std::string OutputText(const Tokenizer& tok, const CompletionResult& r) {
  IncrementalDetokenizer detok(tok, /*skip_special_tokens=*/true, r.prompt_ids);
  std::string text;
  for (int32_t id : r.output_ids) text += detok.Add(id).value_or("");
  return text + detok.Flush();
}

void PrintResult(const CompletionResult& r, bool json, bool with_logprobs,
                 bool with_prompt_logprobs, const Tokenizer* tok) {
  if (!json) {
    std::printf("%s\nfinish_reason: %s\n",
                absl::StrJoin(r.output_ids, " ").c_str(),
                r.finish_reason.c_str());
    if (tok != nullptr) std::printf("text: %s\n", OutputText(*tok, r).c_str());
    if (with_prompt_logprobs) {  // token:logprob of prompt tokens 1, 2, ...
      std::string scores;
      for (const SampledToken& t : r.prompt_logprobs) {
        absl::StrAppend(&scores, scores.empty() ? "" : " ", t.id, ":",
                        t.logprob);
      }
      std::printf("prompt_logprobs: %s\n", scores.c_str());
    }
    return;
  }
  nlohmann::json j;
  j["prompt_ids"] = r.prompt_ids;
  j["output_ids"] = r.output_ids;
  if (tok != nullptr) j["text"] = OutputText(*tok, r);
  j["finish_reason"] = r.finish_reason;
  if (with_logprobs) {
    nlohmann::json tl = nlohmann::json::array();
    for (const auto& pos : r.top_logprobs) {
      nlohmann::json p = nlohmann::json::array();
      for (const auto& [id, lp] : pos) p.push_back({id, lp});
      tl.push_back(p);
    }
    j["top_logprobs"] = tl;
  }
  if (with_prompt_logprobs) {
    // null for the first prompt token (nothing before it scores it).
    nlohmann::json pl = nlohmann::json::array({nullptr});
    for (const SampledToken& t : r.prompt_logprobs) {
      pl.push_back(ScoredTokenJson(t.id, t.logprob, t.rank, t.top_logprobs));
    }
    j["prompt_logprobs"] = pl;
  }
  std::printf("%s\n", j.dump().c_str());
}

int RunComplete(const std::vector<std::string>& args) {
  // A TEXT argument, even "" (which is BOS alone for a tokenizer adding it).
  const bool has_text = args.size() > 1;
  const std::string text_prompt = absl::StrJoin(
      std::vector<std::string>(args.begin() + std::min<size_t>(1, args.size()),
                               args.end()),
      " ");
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto tok = LoadTokenizer(); tok.ok()) {
    tokenizer = std::move(*tok);
  } else if (has_text) {
    const std::string from =
        absl::GetFlag(FLAGS_tokenizer).empty()
            ? "--model=" + absl::GetFlag(FLAGS_model)
            : "--tokenizer=" + absl::GetFlag(FLAGS_tokenizer);
    std::fprintf(stderr,
                 "complete: cannot load the tokenizer of %s to tokenize the "
                 "prompt: %s\n",
                 from.c_str(), tok.status().ToString().c_str());
    return 1;  // as a model that cannot load (2 is for bad usage)
  }
  if (has_text && tokenizer == nullptr) {
    std::fprintf(stderr,
                 "complete: --model=%s has no tokenizer to tokenize a TEXT "
                 "prompt; give --prompt_ids=1,2,3 (or --input_jsonl), or "
                 "--tokenizer=DIR\n",
                 absl::GetFlag(FLAGS_model).c_str());
    return 2;
  }
  std::vector<GenerationRequest> requests;
  const std::string input = absl::GetFlag(FLAGS_input_jsonl);
  if (!input.empty()) {
    std::ifstream in(input);
    if (!in) {
      std::fprintf(stderr, "complete: cannot open --input_jsonl=%s\n",
                   input.c_str());
      return 2;
    }
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto r = RequestFromJson(line);
      if (!r.ok()) {
        std::fprintf(stderr, "complete: %s line %d: %s\n", input.c_str(),
                     line_no, std::string(r.status().message()).c_str());
        return 2;
      }
      requests.push_back(std::move(*r));
    }
  } else {
    if (has_text && !absl::GetFlag(FLAGS_prompt_ids).empty()) {
      std::fprintf(stderr,
                   "complete: give a TEXT prompt or --prompt_ids, not both\n");
      return 2;
    }
    auto ids =
        !has_text ? ParseIds(absl::GetFlag(FLAGS_prompt_ids), "--prompt_ids")
                  : tokenizer->Encode(text_prompt, /*add_special_tokens=*/true);
    auto r = ids.ok() ? RequestFromFlags(*ids) : ids.status();
    if (!r.ok()) {
      std::fprintf(stderr, "complete: %s\n",
                   std::string(r.status().message()).c_str());
      return 2;
    }
    if (r->prompt_ids.empty()) {
      std::fprintf(stderr, has_text
                               ? "complete: empty prompt: the text yields no "
                                 "tokens to run\n"
                               : "complete: empty prompt: give TEXT, "
                                 "--prompt_ids=1,2,3 or --input_jsonl=FILE\n");
      return 2;
    }
    requests.push_back(std::move(*r));
  }
  auto options = EngineOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "complete: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = CheckSchedulerOptions(SchedulerOptionsFromFlags());
      !s.ok()) {
    std::fprintf(stderr, "complete: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  auto engine = Engine::Create(*options);
  if (!engine.ok()) {
    std::fprintf(stderr, "complete: cannot load model: %s\n",
                 engine.status().ToString().c_str());
    return 1;
  }
  const std::vector<CompletionResult> results =
      RunCompletions(**engine, requests);
  const bool json = absl::GetFlag(FLAGS_json) || !input.empty();
  int rc = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].status.ok()) {
      std::fprintf(stderr, "complete: request %zu: %s\n", i + 1,
                   results[i].status.ToString().c_str());
      rc = 1;
      continue;
    }
    PrintResult(results[i], json, requests[i].sampling.top_logprobs > 0,
                requests[i].prompt_logprobs >= 0, tokenizer.get());
  }
  return rc;
}

PDSERVE_SUBCOMMAND(
    "complete", "generate token ids in-process (no servers)",
    "pdserve complete --model=DIR|synthetic:NAME (TEXT | --prompt_ids=1,2,3) "
    "[--max_tokens=N] [--temperature --top_p --top_k --min_p --seed ...] "
    "[--top_logprobs=K] [--prompt_logprobs=K] [--json]\n"
    "pdserve complete --input_jsonl=FILE   (one {\"prompt_ids\": [...], ...} "
    "per "
    "line, run concurrently; one JSON line per request, in input order)",
    FlagNames({EngineFlagNames(),
               SamplingFlagNames(),
               {"max_num_seqs", "prefill_chunk_tokens", "tokenizer",
                "prompt_ids", "input_jsonl", "json", "prompt_logprobs"}}),
    RunComplete);

}  // namespace
}  // namespace pdserve
