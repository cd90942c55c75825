// `pdserve bench`: the load generator. Sends a dataset to the router at a
// request rate (or a sweep of rates), prints the latency/throughput/goodput
// report, and writes the full result as JSON and plots as SVG. `--compare`
// prints earlier JSON results side by side and overlays their plots.
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/sampling/sampler.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/status_macros.h"
#include "tools/common_flags.h"
#include "tools/loadgen/arrival.h"
#include "tools/loadgen/client.h"
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/openai_backend.h"
#include "tools/loadgen/report.h"
#include "tools/loadgen/runner.h"
#include "tools/loadgen/stats.h"
#include "tools/loadgen/svg_plot.h"
#include "tools/subcommand.h"

ABSL_FLAG(std::string, dataset, "random",
          "bench dataset: random | fixed | prefix | mixed (ignored with "
          "--dataset_file)");
ABSL_FLAG(std::string, dataset_file, "",
          "bench: JSONL requests {\"prompt\": ..., \"max_tokens\": N} or "
          "{\"prompt_ids\": [...]}, cycled up to --num_prompts");
ABSL_FLAG(int32_t, num_prompts, 100, "bench: number of requests per run");
ABSL_FLAG(int32_t, input_len, 128,
          "bench: prompt tokens (the short class of `mixed`; the suffix of "
          "`prefix`)");
ABSL_FLAG(int32_t, output_len, 64,
          "bench: max_tokens of each request (EOS is ignored unless "
          "--stop_at_eos)");
ABSL_FLAG(double, range_ratio, 0.0,
          "bench: lengths uniform in [len*(1-r), len*(1+r)]");
ABSL_FLAG(int32_t, prefix_len, 64, "bench `prefix`: shared prefix tokens");
ABSL_FLAG(int32_t, num_prefixes, 4, "bench `prefix`: distinct shared prefixes");
ABSL_FLAG(double, long_fraction, 0.1,
          "bench `mixed`: fraction of long prompts");
ABSL_FLAG(int32_t, long_input_len, 1024, "bench `mixed`: long prompt tokens");
ABSL_FLAG(std::string, request_rate, "inf",
          "bench: requests/s of the arrival process, or inf (all at once)");
ABSL_FLAG(
    double, burstiness, 1.0,
    "bench: gamma shape of inter-arrival gaps (1 = Poisson, <1 burstier)");
ABSL_FLAG(int32_t, max_concurrency, 0,
          "bench: cap on requests in flight (0 = none)");
ABSL_FLAG(double, slo_ttft_ms, 0,
          "bench SLO on time to first token (0 = none)");
ABSL_FLAG(double, slo_tpot_ms, 0,
          "bench SLO on time per output token (0 = none)");
ABSL_FLAG(double, slo_e2e_ms, 0, "bench SLO on end-to-end latency (0 = none)");
ABSL_FLAG(std::string, json_out, "",
          "bench: write the full result (every request) as JSON to this file");
ABSL_FLAG(
    std::string, plot, "",
    "bench: write an SVG (latency CDFs + timeline; sweep: goodput curve)");
ABSL_FLAG(bool, sweep, false, "bench: run once per --request_rates");
ABSL_FLAG(std::vector<std::string>, request_rates,
          std::vector<std::string>({"1", "2", "4", "8"}),
          "bench --sweep: request rates to run");
ABSL_FLAG(std::string, run_label, "",
          "bench: a name for this run (reports, plots)");
ABSL_FLAG(std::vector<std::string>, compare, {},
          "bench: JSON results (from --json_out) to print side by side and "
          "plot together; sends no requests");
ABSL_FLAG(double, request_timeout_s, 600, "bench: deadline of each request");
ABSL_FLAG(int32_t, num_channels, 4, "bench: gRPC connections to the router");
ABSL_FLAG(bool, stop_at_eos, false,
          "bench: let EOS end a request early (default: ignore EOS so every "
          "request produces its max_tokens)");
ABSL_FLAG(bool, progress, true, "bench: live progress line on stderr");
ABSL_FLAG(std::string, backend, "grpc",
          "bench: grpc (the router's --target) or openai (any "
          "OpenAI-compatible server at --base_url: pdserve's HTTP API, vLLM, "
          "llama.cpp's server)");
ABSL_FLAG(std::string, base_url, "http://127.0.0.1:8000/v1",
          "bench --backend=openai: the API's base URL");
ABSL_FLAG(std::string, openai_model, "",
          "bench --backend=openai: the `model` to request (default: the "
          "first of GET /models)");

namespace pdserve {
namespace {

using loadgen::BenchResult;

absl::Status WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

loadgen::SloSpec SloFromFlags() {
  loadgen::SloSpec slo;
  if (absl::GetFlag(FLAGS_slo_ttft_ms) > 0) {
    slo.ttft_ms = absl::GetFlag(FLAGS_slo_ttft_ms);
  }
  if (absl::GetFlag(FLAGS_slo_tpot_ms) > 0) {
    slo.tpot_ms = absl::GetFlag(FLAGS_slo_tpot_ms);
  }
  if (absl::GetFlag(FLAGS_slo_e2e_ms) > 0) {
    slo.e2e_ms = absl::GetFlag(FLAGS_slo_e2e_ms);
  }
  return slo;
}

pdserve::v1::GenerateRequest RequestTemplateFromFlags() {
  pdserve::v1::GenerateRequest req;
  auto* s = req.mutable_sampling();
  s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  if (absl::GetFlag(FLAGS_top_p) != 1.0) {
    s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  }
  if (absl::GetFlag(FLAGS_top_k) != 0) s->set_top_k(absl::GetFlag(FLAGS_top_k));
  if (absl::GetFlag(FLAGS_min_p) != 0.0) {
    s->set_min_p(static_cast<float>(absl::GetFlag(FLAGS_min_p)));
  }
  s->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  req.set_ignore_eos(!absl::GetFlag(FLAGS_stop_at_eos));
  return req;
}

absl::StatusOr<std::vector<loadgen::BenchRequest>> DatasetFromFlags(
    const loadgen::ModelInfo& model, uint64_t seed) {
  loadgen::DatasetOptions o;
  if (!absl::GetFlag(FLAGS_dataset_file).empty()) {
    o.kind = loadgen::DatasetKind::kFile;
    o.file = absl::GetFlag(FLAGS_dataset_file);
  } else {
    ASSIGN_OR_RETURN(o.kind,
                     loadgen::ParseDatasetKind(absl::GetFlag(FLAGS_dataset)));
  }
  o.num_prompts = absl::GetFlag(FLAGS_num_prompts);
  o.input_len = absl::GetFlag(FLAGS_input_len);
  o.output_len = absl::GetFlag(FLAGS_output_len);
  o.range_ratio = absl::GetFlag(FLAGS_range_ratio);
  o.prefix_len = absl::GetFlag(FLAGS_prefix_len);
  o.num_prefixes = absl::GetFlag(FLAGS_num_prefixes);
  o.long_fraction = absl::GetFlag(FLAGS_long_fraction);
  o.long_input_len = absl::GetFlag(FLAGS_long_input_len);
  o.seed = seed;
  if (model.vocab_size <= 1) {
    return absl::FailedPreconditionError("router reported no vocabulary size");
  }
  loadgen::SafeTokenRange(model.vocab_size, &o.token_lo, &o.token_hi);
  ASSIGN_OR_RETURN(std::vector<loadgen::BenchRequest> requests,
                   loadgen::BuildDataset(o));
  // Fit every request into the model's context: token-id prompts are cut
  // to context - max_tokens (and said so); what cannot fit fails now,
  // before anything is sent.
  if (model.max_context > 0) {
    int clamped = 0, longest = 0, longest_to = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto& r = requests[i];
      if (r.input_tokens + r.max_tokens <= model.max_context) continue;
      const int room = model.max_context - r.max_tokens;
      if (r.prompt_ids.empty() || room < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "request ", i, " needs ", r.input_tokens, " prompt + ",
            r.max_tokens, " output tokens > the model's context of ",
            model.max_context,
            " (lower --input_len/--long_input_len/--output_len)"));
      }
      if (r.input_tokens > longest) {
        longest = r.input_tokens;
        longest_to = room;
      }
      r.prompt_ids.resize(room);
      r.input_tokens = room;
      ++clamped;
    }
    if (clamped > 0) {
      std::fprintf(stderr,
                   "[bench] %d of %zu prompts cut to fit the model's context "
                   "of %d tokens (longest %d -> %d prompt tokens)\n",
                   clamped, requests.size(), model.max_context, longest,
                   longest_to);
    }
  }
  return requests;
}

// Runs one dataset at one rate; `seed` drives the arrival process.
absl::StatusOr<BenchResult> RunOnce(
    loadgen::BenchBackend& client,
    const std::vector<loadgen::BenchRequest>& requests, double rate,
    const std::string& dataset_name, uint64_t seed) {
  loadgen::RunOptions opts;
  opts.request_rate = rate;
  opts.burstiness = absl::GetFlag(FLAGS_burstiness);
  opts.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  opts.seed = seed;
  opts.request_template = RequestTemplateFromFlags();
  opts.request_timeout = absl::Seconds(absl::GetFlag(FLAGS_request_timeout_s));
  opts.progress = absl::GetFlag(FLAGS_progress);
  BenchResult result;
  ASSIGN_OR_RETURN(result.records,
                   loadgen::RunBenchmark(client, requests, opts));
  result.info.label = absl::GetFlag(FLAGS_run_label);
  result.info.target = client.target();
  result.info.dataset = dataset_name;
  result.info.num_prompts = static_cast<int32_t>(requests.size());
  result.info.request_rate = rate;
  result.info.burstiness = opts.burstiness;
  result.info.max_concurrency = opts.max_concurrency;
  result.info.seed = opts.seed;
  result.info.slo = SloFromFlags();
  result.metrics = loadgen::ComputeMetrics(
      result.records, loadgen::RunDuration(result.records), result.info.slo);
  return result;
}

// --compare: single runs side by side with overlaid CDFs/timelines, or
// sweeps (one table each, goodput curves overlaid).
absl::Status RunCompare() {
  std::vector<BenchResult> results;
  std::vector<loadgen::SweepResult> sweeps;
  for (const std::string& path : absl::GetFlag(FLAGS_compare)) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    if (loadgen::IsSweepJson(text)) {
      absl::StatusOr<loadgen::SweepResult> s = loadgen::SweepFromJson(text);
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": ", s.status().message()));
      }
      if (s->label.empty()) s->label = path;
      sweeps.push_back(*std::move(s));
      continue;
    }
    absl::StatusOr<BenchResult> r = loadgen::ResultFromJson(text);
    if (!r.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", r.status().message()));
    }
    if (r->info.label.empty()) r->info.label = path;
    results.push_back(*std::move(r));
  }
  if (!results.empty() && !sweeps.empty()) {
    return absl::InvalidArgumentError(
        "--compare takes single runs or sweeps, not both");
  }
  const std::string plot = absl::GetFlag(FLAGS_plot);
  if (!sweeps.empty()) {
    std::vector<std::vector<loadgen::SweepPoint>> series;
    std::vector<std::string> labels;
    for (const loadgen::SweepResult& s : sweeps) {
      std::printf("== %s ==\n%s\n", s.label.c_str(),
                  loadgen::FormatSweep(s.points, s.slo).c_str());
      series.push_back(s.points);
      labels.push_back(s.label);
    }
    if (!plot.empty()) {
      RETURN_IF_ERROR(WriteFile(
          plot, loadgen::RenderSweepSvg(series, labels, sweeps.front().slo)));
    }
    return absl::OkStatus();
  }
  std::printf("%s", loadgen::FormatComparison(results).c_str());
  if (!plot.empty()) {
    RETURN_IF_ERROR(WriteFile(plot, loadgen::RenderBenchSvg(results)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<loadgen::BenchBackend>> BackendFromFlags() {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "grpc") {
    ASSIGN_OR_RETURN(const std::string target, RouterTargetFromFlags());
    ASSIGN_OR_RETURN(
        std::unique_ptr<loadgen::BenchClient> client,
        loadgen::BenchClient::Connect(target, absl::GetFlag(FLAGS_num_channels),
                                      absl::Seconds(15)));
    return std::unique_ptr<loadgen::BenchBackend>(std::move(client));
  }
  if (backend != "openai") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --backend '", backend, "' (grpc or openai)"));
  }
  // The OpenAI API does not report the vocabulary: random token-id prompts
  // take it from the local tokenizer (--tokenizer, or the --model
  // directory's), which must be the served model's.
  loadgen::OpenAiBackendOptions o;
  o.base_url = absl::GetFlag(FLAGS_base_url);
  o.model = absl::GetFlag(FLAGS_openai_model);
  std::string tok_path = absl::GetFlag(FLAGS_tokenizer);
  if (tok_path.empty()) tok_path = absl::GetFlag(FLAGS_model);
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(tok_path));
  o.vocab_size = tok->vocab_size();
  ASSIGN_OR_RETURN(std::unique_ptr<loadgen::OpenAiBackend> client,
                   loadgen::OpenAiBackend::Connect(o, absl::Seconds(15)));
  return std::unique_ptr<loadgen::BenchBackend>(std::move(client));
}

// The flags that need no server, checked before connecting: a typo fails
// at once instead of after the target's 15 s deadline (the dataset is built
// once for a stand-in vocabulary, which checks its flags and file).
absl::Status CheckFlagsBeforeConnecting() {
  loadgen::ModelInfo stand_in;
  stand_in.vocab_size = 32000;
  RETURN_IF_ERROR(DatasetFromFlags(stand_in, 0).status());
  if (absl::GetFlag(FLAGS_sweep)) {
    for (const std::string& r : absl::GetFlag(FLAGS_request_rates)) {
      RETURN_IF_ERROR(loadgen::ParseRequestRate(r).status());
    }
  } else {
    RETURN_IF_ERROR(
        loadgen::ParseRequestRate(absl::GetFlag(FLAGS_request_rate)).status());
  }
  SamplingParams sampling;
  sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  sampling.top_k = absl::GetFlag(FLAGS_top_k);
  sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  if (absl::Status s = ValidateSamplingParams(sampling); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  if (!(absl::GetFlag(FLAGS_burstiness) > 0)) {
    return absl::InvalidArgumentError(
        "--burstiness must be positive (1 = Poisson arrivals)");
  }
  if (absl::GetFlag(FLAGS_max_concurrency) < 0) {
    return absl::InvalidArgumentError(
        "--max_concurrency must be 0 (no cap) or more");
  }
  if (!(absl::GetFlag(FLAGS_request_timeout_s) > 0)) {
    return absl::InvalidArgumentError("--request_timeout_s must be positive");
  }
  if (absl::GetFlag(FLAGS_num_channels) < 1) {
    return absl::InvalidArgumentError("--num_channels must be at least 1");
  }
  // Output files are written after the run: their folder must take them.
  for (const auto& [flag, path] :
       {std::pair<const char*, std::string>{"json_out",
                                            absl::GetFlag(FLAGS_json_out)},
        {"plot", absl::GetFlag(FLAGS_plot)}}) {
    if (path.empty()) continue;
    const std::filesystem::path dir =
        std::filesystem::path(path).has_parent_path()
            ? std::filesystem::path(path).parent_path()
            : std::filesystem::path(".");
    if (access(dir.c_str(), W_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", path, ": cannot write into ",
                       dir.string(), " (", std::strerror(errno), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status RunBench() {
  if (!absl::GetFlag(FLAGS_compare).empty()) return RunCompare();
  RETURN_IF_ERROR(CheckFlagsBeforeConnecting());
  ASSIGN_OR_RETURN(std::unique_ptr<loadgen::BenchBackend> client,
                   BackendFromFlags());
  ASSIGN_OR_RETURN(loadgen::ModelInfo model,
                   client->GetModelInfo(absl::Seconds(15)));
  std::fprintf(stderr,
               "[bench] target %s: model %s (vocab %d, context %d), mode %s, "
               "%d prefill + %d decode workers\n",
               client->target().c_str(), model.model.c_str(), model.vocab_size,
               model.max_context, model.mode.c_str(), model.num_prefill_workers,
               model.num_decode_workers);
  const uint64_t seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  const std::string dataset_name = absl::GetFlag(FLAGS_dataset_file).empty()
                                       ? absl::GetFlag(FLAGS_dataset)
                                       : absl::GetFlag(FLAGS_dataset_file);
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  const std::string plot = absl::GetFlag(FLAGS_plot);

  if (absl::GetFlag(FLAGS_sweep)) {
    // Each rate gets fresh prompts (seed + i): a server-side prefix cache
    // must not turn later points into cache hits of earlier ones.
    std::vector<loadgen::SweepPoint> points;
    const std::vector<std::string> rates = absl::GetFlag(FLAGS_request_rates);
    for (size_t i = 0; i < rates.size(); ++i) {
      ASSIGN_OR_RETURN(double rate, loadgen::ParseRequestRate(rates[i]));
      std::fprintf(stderr, "[bench] sweep: request rate %s req/s\n",
                   loadgen::FormatRate(rate).c_str());
      ASSIGN_OR_RETURN(std::vector<loadgen::BenchRequest> requests,
                       DatasetFromFlags(model, seed + i));
      ASSIGN_OR_RETURN(BenchResult r, RunOnce(*client, requests, rate,
                                              dataset_name, seed + i));
      points.push_back({rate, r.metrics});
    }
    const loadgen::SloSpec slo = SloFromFlags();
    const std::string label = absl::GetFlag(FLAGS_run_label).empty()
                                  ? model.mode
                                  : absl::GetFlag(FLAGS_run_label);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", loadgen::SweepToJson(label, points, slo).c_str());
    } else {
      std::printf("%s", loadgen::FormatSweep(points, slo).c_str());
    }
    if (!json_out.empty()) {
      RETURN_IF_ERROR(
          WriteFile(json_out, loadgen::SweepToJson(label, points, slo)));
    }
    if (!plot.empty()) {
      const std::string label = absl::GetFlag(FLAGS_run_label);
      RETURN_IF_ERROR(WriteFile(
          plot, loadgen::RenderSweepSvg(
                    {points}, {label.empty() ? model.mode : label}, slo)));
    }
    return absl::OkStatus();
  }

  ASSIGN_OR_RETURN(double rate, loadgen::ParseRequestRate(
                                    absl::GetFlag(FLAGS_request_rate)));
  ASSIGN_OR_RETURN(std::vector<loadgen::BenchRequest> requests,
                   DatasetFromFlags(model, seed));
  ASSIGN_OR_RETURN(BenchResult result,
                   RunOnce(*client, requests, rate, dataset_name, seed));
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", loadgen::ResultToJson(result).c_str());
  } else {
    std::printf("%s", loadgen::FormatReport(result).c_str());
  }
  if (!json_out.empty()) {
    RETURN_IF_ERROR(WriteFile(json_out, loadgen::ResultToJson(result)));
  }
  if (!plot.empty()) {
    RETURN_IF_ERROR(WriteFile(plot, loadgen::RenderBenchSvg({result})));
  }
  // A run in which nothing completed measured nothing: fail it, naming the
  // first error (failures among completed requests are part of the result).
  if (result.metrics.completed == 0 && result.metrics.failed > 0) {
    std::string first_error;
    for (const loadgen::RequestRecord& r : result.records) {
      if (!r.ok()) {
        first_error =
            absl::StrCat(absl::StatusCodeToString(
                             static_cast<absl::StatusCode>(r.status_code)),
                         ": ", r.error_message);
        break;
      }
    }
    return absl::UnavailableError(absl::StrCat(
        "all ", result.metrics.failed,
        " requests failed, nothing was measured; the first: ", first_error));
  }
  return absl::OkStatus();
}

int RunBenchCommand(const std::vector<std::string>& args) {
  if (args.size() > 1) {
    std::fprintf(stderr, "pdserve bench: unexpected argument '%s'\n",
                 args[1].c_str());
    return 2;
  }
  const absl::Status status = RunBench();
  if (!status.ok()) {
    std::fprintf(stderr, "pdserve bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

PDSERVE_SUBCOMMAND(
    "bench", "load generator: latency percentiles, throughput, goodput",
    "pdserve bench [--target=HOST:PORT | --backend=openai "
    "--base_url=http://HOST:PORT/v1 [--tokenizer=DIR]] "
    "[--dataset=random|fixed|prefix|mixed | "
    "--dataset_file=F.jsonl] [--num_prompts=N] [--request_rate=R|inf] "
    "[--burstiness=B] [--max_concurrency=C] [--slo_ttft_ms=..] "
    "[--slo_tpot_ms=..] [--slo_e2e_ms=..] [--json_out=F] [--plot=F.svg] "
    "[--sweep --request_rates=1,2,4,8]\n"
    "       pdserve bench --compare=a.json,b.json [--plot=F.svg]",
    FlagNames({{"target", "model", "tokenizer", "temperature", "top_p", "top_k",
                "min_p", "seed", "json"}}),
    RunBenchCommand);

}  // namespace
}  // namespace pdserve
