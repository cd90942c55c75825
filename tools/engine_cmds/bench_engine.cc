// `pdserve bench-engine`: prefill and decode throughput of the engine next to
// a memory-bandwidth probe and a GEMM rate measured in the same run, so the
// figures read as ratios; plus peak RSS against weights + KV budget. On
// --device=cpu the probes are a multi-threaded read and oneDNN's GEMM; on
// --device=cuda a device-to-device copy and cuBLAS's GEMM (bf16 in, f32
// accumulate) of the same shape.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/backend/cpu/bench_probes.h"
#include "common/backend/cuda/cuda_device.h"
#include "common/backend/thread_pool.h"
#include "common/engine/engine.h"
#include "common/model/model_source.h"
#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/common_flags.h"
#include "tools/subcommand.h"

ABSL_FLAG(int32_t, prompt_len, 512, "bench-engine: prompt tokens to prefill");
ABSL_FLAG(int32_t, gen_len, 128, "bench-engine: decode steps per batch size");
ABSL_FLAG(std::vector<std::string>, batch,
          std::vector<std::string>({"1", "8", "32"}),
          "bench-engine: decode batch sizes (comma-separated)");
ABSL_FLAG(std::vector<std::string>, decode_contexts, {},
          "bench-engine: also decode one sequence at each of these contexts "
          "(comma-separated, e.g. 16,512,2016), the steps interleaved "
          "round-robin so that every context sees the same machine; reports "
          "tok/s per context and its ratio to the first context's");
ABSL_FLAG(int32_t, context_steps, 64,
          "bench-engine: timed decode steps per --decode_contexts context");

namespace pdserve {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Progress(const std::string& text) {
  std::fprintf(stderr, "\r\033[Kbench-engine: %s", text.c_str());
  std::fflush(stderr);
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "bench-engine: %s\n", message.c_str());
  return 1;
}

int RunBenchEngine(const std::vector<std::string>&) {
  // Large blocks always mmapped, so that a probe's freed buffers leave the
  // RSS (glibc would otherwise raise its threshold and keep them).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads > 0) {
    // oneDNN's OpenMP runtime reads this on first use: same threads as ours.
    setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  }
  const int prompt_len = absl::GetFlag(FLAGS_prompt_len);
  const int gen_len = absl::GetFlag(FLAGS_gen_len);
  std::vector<int> batches;
  for (const std::string& b : absl::GetFlag(FLAGS_batch)) {
    int v;
    if (!absl::SimpleAtoi(b, &v) || v <= 0)
      return Fail("bad --batch value " + b);
    batches.push_back(v);
  }
  if (prompt_len <= 0 || gen_len <= 0 || batches.empty()) {
    return Fail("--prompt_len, --gen_len and --batch must be positive");
  }
  std::vector<int> contexts;
  for (const std::string& v : absl::GetFlag(FLAGS_decode_contexts)) {
    int ctx;
    if (!absl::SimpleAtoi(v, &ctx) || ctx <= 0)
      return Fail("bad --decode_contexts value " + v);
    contexts.push_back(ctx);
  }
  const int context_steps = absl::GetFlag(FLAGS_context_steps);
  if (!contexts.empty() && context_steps <= 0) {
    return Fail("--context_steps must be positive");
  }
  // Warm-up steps per context, untimed (first touches of the KV pages).
  constexpr int kContextWarmup = 2;
  auto dtype = ParseComputeDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return Fail(std::string(dtype.status().message()));
  const int max_batch = *std::max_element(batches.begin(), batches.end());

  EngineOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.device = absl::GetFlag(FLAGS_device);
  const bool on_cuda = o.device == "cuda";
  o.weight_dtype = *dtype;
  auto quantization = ParseQuantization(absl::GetFlag(FLAGS_quantization));
  if (!quantization.ok())
    return Fail(std::string(quantization.status().message()));
  o.quantization = *quantization;
  o.num_threads = threads;
  o.block_size = absl::GetFlag(FLAGS_block_size);
  const std::string kv_flag = absl::GetFlag(FLAGS_kv_dtype);
  if (kv_flag != "auto") {
    auto kv_dtype = ParseComputeDType(kv_flag);
    if (!kv_dtype.ok()) return Fail(std::string(kv_dtype.status().message()));
    o.kv_dtype = *kv_dtype;
  }
  const DType kv_dtype = o.kv_dtype.value_or(o.weight_dtype);
  o.max_batch_tokens = std::max(prompt_len, max_batch);
  for (int ctx : contexts)
    o.max_batch_tokens = std::max(o.max_batch_tokens, ctx);
  {
    // KV budget: every decode sequence at its final length.
    auto source = OpenModelSource(o.model, o.weight_dtype, 0);
    if (!source.ok()) return Fail(source.status().ToString());
    const ModelConfig& c = (*source)->config();
    if (prompt_len + gen_len > c.max_position_embeddings) {
      return Fail("--prompt_len + --gen_len exceeds the model's context");
    }
    const int64_t blocks_per_seq =
        (prompt_len + gen_len + o.block_size - 1) / o.block_size;
    int64_t blocks = (max_batch + 1) * blocks_per_seq;
    for (int ctx : contexts) {
      if (ctx + kContextWarmup + context_steps > c.max_position_embeddings) {
        return Fail(absl::StrCat("--decode_contexts ", ctx, " + ",
                                 kContextWarmup + context_steps,
                                 " steps exceeds the model's context"));
      }
      blocks += (ctx + kContextWarmup + context_steps + o.block_size - 1) /
                o.block_size;
    }
    o.kv_cache_bytes = blocks * o.block_size * int64_t{2} * c.num_kv_heads *
                       c.head_dim * DTypeSize(kv_dtype) * c.num_layers;
  }
  Progress("loading " + o.model);
  const double t_load = Now();
  auto created = Engine::Create(o);
  if (!created.ok()) return Fail(created.status().ToString());
  Engine& e = **created;
  const double load_s = Now() - t_load;
  const ModelConfig& c = e.config();
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(),
                KV = c.kv_dim();
  const double layer_params =
      static_cast<double>(H * (Q + 2 * KV) + Q * H + 3 * H * I);

  std::mt19937 rng(1);
  std::vector<int32_t> prompt(prompt_len);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
  std::vector<float> logits;

  // The reference probes, run interleaved with the engine's measurements so
  // that both see the same machine (on a shared machine the load drifts
  // between phases). The bandwidth probe reads as many bytes as one decode
  // step streams weights; its buffer is freed and the peak-RSS mark reset
  // after each use so that peak RSS stays the engine's own.
  ThreadPool probe_pool(on_cuda ? 1 : threads);
  const int64_t probe_bytes =
      on_cuda ? int64_t{1} << 30 : e.weight_bytes_per_pass();
  int64_t peak_rss = 0;
  std::vector<double> all_probe;
  auto quiesce = [] {  // let spinning pool / OpenMP threads go to sleep
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  };
  auto bandwidth_probe = [&](int reps) -> absl::StatusOr<std::vector<double>> {
    quiesce();
    std::vector<double> gbps;
    if (on_cuda) {
      for (int r = 0; r < reps; ++r) {
        auto copy = MeasureCudaCopyGbps(probe_bytes, 3);
        if (!copy.ok()) return copy.status();
        gbps.push_back(*copy);
      }
    } else {
      peak_rss = std::max(peak_rss, PeakRssBytes());
      gbps = MeasureReadBandwidthGbps(probe_pool, probe_bytes, reps);
      ResetPeakRss();
    }
    all_probe.insert(all_probe.end(), gbps.begin(), gbps.end());
    quiesce();
    return gbps;
  };
  std::vector<double> gemm_runs;
  absl::Status gemm_status;
  auto gemm_probe = [&] {
    quiesce();
    peak_rss = std::max(peak_rss, PeakRssBytes());
    absl::StatusOr<double> g =
        on_cuda
            ? MeasureCublasGemmGflops(prompt_len, 2 * I, H, *dtype, 1)
            : MeasureOneDnnGemmGflops(prompt_len, 2 * I, H, *dtype, threads, 1);
    if (g.ok()) {
      gemm_runs.push_back(*g);
    } else {
      gemm_status = g.status();
    }
    ResetPeakRss();
    quiesce();
  };

  // Prefill: one sequence of prompt_len tokens, best of kPrefillRuns after a
  // warm-up, each run preceded by one GEMM probe run (after its own warm-up):
  // best of kPrefillRuns against best of kPrefillRuns.
  constexpr int kPrefillRuns = 4;
  Progress("prefill warm-up");
  {
    SeqId s = *e.CreateSequence();
    Engine::ForwardItem item{
        s, absl::MakeConstSpan(prompt.data(), std::min(prompt_len, 64)), true};
    if (auto st = e.Forward({&item, 1}, &logits); !st.ok())
      return Fail(st.ToString());
    e.FreeSequence(s);
  }
  double prefill_s = 1e30;
  SeqId base = 0;
  for (int rep = 0; rep < kPrefillRuns; ++rep) {
    Progress(absl::StrCat("GEMM probe ", rep + 1));
    gemm_probe();
    Progress(absl::StrCat("prefill ", prompt_len, " tokens, run ", rep + 1, "/",
                          kPrefillRuns));
    SeqId s = *e.CreateSequence();
    Engine::ForwardItem item{s, prompt, true};
    const double t0 = Now();
    if (auto st = e.Forward({&item, 1}, &logits); !st.ok())
      return Fail(st.ToString());
    prefill_s = std::min(prefill_s, Now() - t0);
    if (rep == 0) {
      base = s;
    } else {
      e.FreeSequence(s);
    }
  }
  double attn_pairs = 0;  // sum over tokens of the positions each attends to
  for (int t = 0; t < prompt_len; ++t) attn_pairs += t + 1;
  const double prefill_flops =
      2.0 * prompt_len * layer_params * c.num_layers + 2.0 * c.vocab_size * H +
      4.0 * c.num_layers * c.num_heads * c.head_dim * attn_pairs;

  // Decode: `batch` copies of the prefilled sequence (KV cloned by
  // export/import), gen_len steps each, with kProbeReps bandwidth-probe reads
  // right before and right after and one after every kProbeEvery steps
  // (steps are timed one by one, probes between them). GB/s use the median
  // step time against the median of those paired probe reads.
  constexpr int kProbeReps = 3;
  constexpr int kProbeEvery = 16;
  const int64_t kv_token_bytes =
      e.kv_layout().BytesPerTokenPerLayer() * c.num_layers;
  nlohmann::json decode = nlohmann::json::array();
  struct DecodeRow {
    int batch;
    double mean_step_s, median_step_s, weight_gbps, total_gbps, probe_gbps;
  };
  std::vector<DecodeRow> rows;
  for (int batch : batches) {
    std::vector<SeqId> seqs;
    for (int b = 0; b < batch; ++b) {
      SeqId s = *e.CreateSequence();
      if (auto st = e.Reserve(s, prompt_len + gen_len); !st.ok())
        return Fail(st.ToString());
      std::string bytes;
      for (int l = 0; l < c.num_layers; ++l) {
        (void)e.ExportLayerKv(base, l, 0, prompt_len, &bytes);
        (void)e.ImportLayerKv(s, l, 0, prompt_len, bytes);
      }
      (void)e.SetSequenceLength(s, prompt_len);
      seqs.push_back(s);
    }
    Progress(absl::StrCat("bandwidth probe (batch ", batch, ")"));
    auto before = bandwidth_probe(kProbeReps);
    if (!before.ok()) return Fail(before.status().ToString());
    std::vector<double> paired = *before;
    std::vector<int32_t> next(batch, 5);
    double kv_bytes = 0;
    std::vector<double> steps;
    for (int step = 0; step < gen_len; ++step) {
      if (step % 8 == 0) {
        Progress(absl::StrCat("decode batch ", batch, ": step ", step, "/",
                              gen_len));
      }
      std::vector<Engine::ForwardItem> items;
      for (int b = 0; b < batch; ++b) {
        items.push_back({seqs[b], absl::MakeConstSpan(&next[b], 1), true});
        kv_bytes += static_cast<double>(prompt_len + step + 1) * kv_token_bytes;
      }
      const double t0 = Now();
      if (auto st = e.Forward(items, &logits); !st.ok())
        return Fail(st.ToString());
      steps.push_back(Now() - t0);
      if ((step + 1) % kProbeEvery == 0 && step + 1 < gen_len) {
        auto during = bandwidth_probe(1);
        if (!during.ok()) return Fail(during.status().ToString());
        paired.insert(paired.end(), during->begin(), during->end());
      }
      for (int b = 0; b < batch; ++b) {
        next[b] = static_cast<int32_t>(
            std::max_element(logits.begin() + b * c.vocab_size,
                             logits.begin() + (b + 1) * c.vocab_size) -
            (logits.begin() + b * c.vocab_size));
      }
    }
    Progress(absl::StrCat("bandwidth probe (batch ", batch, ")"));
    auto after = bandwidth_probe(kProbeReps);
    if (!after.ok()) return Fail(after.status().ToString());
    paired.insert(paired.end(), after->begin(), after->end());
    double total_s = 0;
    for (double t : steps) total_s += t;
    const double median_s = Median(steps);
    const double weights = static_cast<double>(e.weight_bytes_per_pass());
    rows.push_back(
        {batch, total_s / gen_len, median_s, weights / median_s / 1e9,
         (weights + kv_bytes / gen_len) / median_s / 1e9, Median(paired)});
    for (SeqId s : seqs) e.FreeSequence(s);
  }
  // Decode at several contexts, one sequence each, the steps interleaved
  // round-robin (context 1, 2, ..., 1, 2, ...): the ratios between contexts
  // come from one stretch of machine time.
  struct ContextRow {
    int context;
    double mean_step_s, median_step_s;
  };
  std::vector<ContextRow> context_rows;
  if (!contexts.empty()) {
    std::vector<int32_t> long_prompt(
        *std::max_element(contexts.begin(), contexts.end()));
    for (auto& t : long_prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
    std::vector<SeqId> seqs;
    for (int ctx : contexts) {
      Progress(absl::StrCat("prefill context ", ctx));
      SeqId s = *e.CreateSequence();
      Engine::ForwardItem item{s, absl::MakeConstSpan(long_prompt.data(), ctx),
                               true};
      if (auto st = e.Forward({&item, 1}, &logits); !st.ok())
        return Fail(st.ToString());
      seqs.push_back(s);
    }
    std::vector<std::vector<double>> steps(contexts.size());
    int32_t token = 5;
    for (int step = 0; step < kContextWarmup + context_steps; ++step) {
      if (step % 8 == 0) {
        Progress(absl::StrCat("decode at contexts: step ", step, "/",
                              kContextWarmup + context_steps));
      }
      for (size_t i = 0; i < contexts.size(); ++i) {
        Engine::ForwardItem item{seqs[i], absl::MakeConstSpan(&token, 1), true};
        const double t0 = Now();
        if (auto st = e.Forward({&item, 1}, &logits); !st.ok())
          return Fail(st.ToString());
        if (step >= kContextWarmup) steps[i].push_back(Now() - t0);
      }
    }
    for (size_t i = 0; i < contexts.size(); ++i) {
      double total = 0;
      for (double t : steps[i]) total += t;
      context_rows.push_back(
          {contexts[i], total / context_steps, Median(steps[i])});
      e.FreeSequence(seqs[i]);
    }
  }
  peak_rss = std::max(peak_rss, PeakRssBytes());

  const double probe_gbps = Median(all_probe);
  std::string device_name = "cpu";
  if (on_cuda) device_name = CudaDeviceDescription().value_or("cuda");
  const char* probe_name =
      on_cuda ? "device-to-device copy (read+write)" : "memory-bandwidth probe";
  const char* gemm_name = on_cuda ? "cuBLAS GEMM" : "oneDNN GEMM";
  std::fprintf(stderr, "\r\033[K");
  const bool gemm_ok = !gemm_runs.empty();
  const double gemm_gflops =
      gemm_ok ? *std::max_element(gemm_runs.begin(), gemm_runs.end()) : 0.0;
  const double prefill_gflops = prefill_flops / prefill_s / 1e9;
  const int64_t budget = e.weight_bytes() + o.kv_cache_bytes;

  const double gemm_fraction = gemm_ok ? prefill_gflops / gemm_gflops : 0.0;
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json j;
    j["model"] = o.model;
    j["dtype"] = DTypeName(*dtype);
    j["quantization"] =
        o.quantization.has_value() ? o.quantization->ToString() : "none";
    j["device"] = o.device;
    j["device_name"] = device_name;
    j["probe"] = probe_name;
    j["probe_bytes"] = probe_bytes;
    j["gemm"] = gemm_name;
    j["threads"] = e.options().num_threads;
    j["prompt_len"] = prompt_len;
    j["gen_len"] = gen_len;
    j["load_s"] = load_s;
    j["probe_bandwidth_gbps"] = probe_gbps;
    j["probe_runs_gbps"] = all_probe;
    j["gemm_gflops"] = gemm_gflops;
    j["gemm_runs_gflops"] = gemm_runs;
    j["gemm_shape"] = {prompt_len, 2 * I, H};
    if (!gemm_ok) j["gemm_error"] = gemm_status.ToString();
    j["prefill"] = {{"tokens_per_s", prompt_len / prefill_s},
                    {"gflops", prefill_gflops},
                    {"tflops", prefill_gflops / 1e3},
                    {"fraction_of_gemm", gemm_fraction}};
    for (const auto& r : rows) {
      decode.push_back(
          {{"batch", r.batch},
           {"tokens_per_s", r.batch / r.mean_step_s},
           {"step_ms", 1e3 * r.mean_step_s},
           {"median_step_ms", 1e3 * r.median_step_s},
           {"weight_gbps", r.weight_gbps},
           {"weight_and_kv_gbps", r.total_gbps},
           {"probe_gbps", r.probe_gbps},
           {"fraction_of_probe", r.weight_gbps / r.probe_gbps},
           {"weight_and_kv_fraction_of_probe", r.total_gbps / r.probe_gbps}});
    }
    j["decode"] = decode;
    if (!context_rows.empty()) {
      nlohmann::json ctx = nlohmann::json::array();
      const ContextRow& first = context_rows[0];
      for (const auto& r : context_rows) {
        ctx.push_back({{"context", r.context},
                       {"tokens_per_s", 1.0 / r.mean_step_s},
                       {"step_ms", 1e3 * r.mean_step_s},
                       {"median_step_ms", 1e3 * r.median_step_s},
                       {"ratio_to_first", first.mean_step_s / r.mean_step_s},
                       {"median_step_ratio_to_first",
                        first.median_step_s / r.median_step_s}});
      }
      j["decode_contexts"] = ctx;
      j["kv_dtype"] = DTypeName(kv_dtype);
    }
    j["weights_bytes"] = e.weight_bytes();
    j["kv_budget_bytes"] = o.kv_cache_bytes;
    j["peak_rss_bytes"] = peak_rss;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf(
      "model %s  dtype %s  quantization %s  device %s  threads %d  "
      "prompt_len %d  gen_len %d  (load %.1f s)\n",
      o.model.c_str(), DTypeName(*dtype),
      o.quantization.has_value() ? o.quantization->ToString().c_str() : "none",
      device_name.c_str(), threads, prompt_len, gen_len, load_s);
  std::printf("%s over %.1f MB  %8.1f GB/s (median of %zu reads)\n", probe_name,
              probe_bytes / 1e6, probe_gbps, all_probe.size());
  if (gemm_ok) {
    std::printf("%s %dx%lldx%lld  %8.1f GFLOP/s (best of %zu)\n", gemm_name,
                prompt_len, static_cast<long long>(2 * I),
                static_cast<long long>(H), gemm_gflops, gemm_runs.size());
  } else {
    std::printf("%s: %s\n", gemm_name, gemm_status.ToString().c_str());
  }
  if (gemm_ok) {
    std::printf(
        "prefill  %8.1f tokens/s  %8.1f GFLOP/s  = %.0f%% of GEMM (best of "
        "%d)\n",
        prompt_len / prefill_s, prefill_gflops, 100 * gemm_fraction,
        kPrefillRuns);
  } else {
    std::printf("prefill  %8.1f tokens/s  %8.1f GFLOP/s  (best of %d)\n",
                prompt_len / prefill_s, prefill_gflops, kPrefillRuns);
  }
  for (const auto& r : rows) {
    std::printf(
        "decode batch %3d  step %7.2f ms (median %.2f)  %8.1f tokens/s  "
        "weights %6.1f GB/s = %.0f%% of probe %.1f  weights+KV %6.1f GB/s "
        "= %.0f%%\n",
        r.batch, 1e3 * r.mean_step_s, 1e3 * r.median_step_s,
        r.batch / r.mean_step_s, r.weight_gbps,
        100 * r.weight_gbps / r.probe_gbps, r.probe_gbps, r.total_gbps,
        100 * r.total_gbps / r.probe_gbps);
  }
  for (const auto& r : context_rows) {
    std::printf(
        "decode at context %5d (%d interleaved steps)  step %7.2f ms (median "
        "%.2f)  %8.1f tokens/s  = %.3f x context %d (by median step %.3f)\n",
        r.context, context_steps, 1e3 * r.mean_step_s, 1e3 * r.median_step_s,
        1.0 / r.mean_step_s, context_rows[0].mean_step_s / r.mean_step_s,
        context_rows[0].context,
        context_rows[0].median_step_s / r.median_step_s);
  }
  std::printf(
      "peak RSS %.1f MiB  vs weights %.1f MiB + KV budget %.1f MiB = %.1f "
      "MiB\n",
      peak_rss / 1048576.0, e.weight_bytes() / 1048576.0,
      o.kv_cache_bytes / 1048576.0, budget / 1048576.0);
  return 0;
}

PDSERVE_SUBCOMMAND(
    "bench-engine",
    "engine prefill/decode throughput vs bandwidth and GEMM probes",
    "pdserve bench-engine --model=synthetic:llama-110m --dtype=f32|bf16 "
    "--prompt_len=512 --gen_len=128 --batch=1,8,32 --threads=2 "
    "[--decode_contexts=16,512,2016 --context_steps=64] [--kv_dtype=bf16] "
    "[--device=cpu|cuda] [--json]",
    FlagNames({{"model", "dtype", "quantization", "kv_dtype", "block_size",
                "threads", "device", "json"}}),
    RunBenchEngine);

}  // namespace
}  // namespace pdserve
