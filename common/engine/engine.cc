#include "common/engine/engine.h"

#include <xxhash.h>

#include <cmath>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/backend/model_runner.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "common/util/system_memory.h"

namespace pdserve {

std::string Engine::numerics() const { return runner_->numerics(); }

Engine::~Engine() = default;

namespace {

// A lower bound of the bytes the CPU runner packs `config`'s weights into
// (the layers' matrices in the weight dtype or at the quantization's bits,
// scales left out; the embedding in the weight dtype; an untied lm_head in
// the weight dtype, int8 when quantized) plus the KV pool; RESOURCE_EXHAUSTED
// when that alone exceeds what this process can take: loading would end in
// an OOM kill minutes later.
absl::Status CheckMemoryForModel(const EngineOptions& options,
                                 const ModelConfig& c,
                                 std::optional<int> checkpoint_bits) {
  const double h = c.hidden_size;
  const double linear =
      static_cast<double>(c.num_layers) *
      (h * c.q_dim() * 2 + h * c.kv_dim() * 2 + 3 * h * c.intermediate_size);
  const double dtype_bytes = DTypeSize(options.weight_dtype);
  std::optional<int> bits = checkpoint_bits;
  if (options.quantization.has_value()) bits = options.quantization->bits;
  const double linear_bytes = bits.has_value() ? *bits / 8.0 : dtype_bytes;
  const double embedding = static_cast<double>(c.vocab_size) * h;
  double weights = linear * linear_bytes + embedding * dtype_bytes;
  if (!c.tie_word_embeddings) {
    weights += embedding * (bits.has_value() ? 1.0 : dtype_bytes);
  }
  const double needed = weights + static_cast<double>(options.kv_cache_bytes);
  ASSIGN_OR_RETURN(const AvailableMemory available, AvailableMemoryNow());
  if (needed <= static_cast<double>(available.bytes)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s needs at least %.1f GiB (weights %.1f GiB as %s%s, KV pool %.1f "
      "GiB), more than this process can take: %s; use --dtype=bf16, "
      "--quantization=int8 or int4, a smaller --kv_cache_memory, or a "
      "machine with more memory",
      options.model, needed / (1 << 30), weights / (1 << 30),
      DTypeName(options.weight_dtype),
      bits.has_value() ? absl::StrCat(" with ", *bits, "-bit layers") : "",
      static_cast<double>(options.kv_cache_bytes) / (1 << 30),
      available.Describe()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineOptions& options) {
  if (options.weight_dtype == DType::kF16) {
    return absl::InvalidArgumentError("weight dtype must be f32 or bf16");
  }
  if (options.block_size <= 0 || options.block_size > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_size must be in [1, 4096], got ", options.block_size));
  }
  if (options.max_batch_tokens <= 0) {
    return absl::InvalidArgumentError("max_batch_tokens must be positive");
  }
  if (options.num_threads < 0 || options.num_threads > kMaxComputeThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be 0 (all cores) to ", kMaxComputeThreads,
                     ", got ", options.num_threads));
  }
  if (options.device != "cpu" && options.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be cpu or cuda, got '", options.device, "'"));
  }
  if (options.quantization.has_value() && options.device != "cpu") {
    return absl::FailedPreconditionError(absl::StrCat(
        "--quantization=", options.quantization->ToString(),
        " is CPU-only: the ", options.device,
        " backend has no quantized kernels (use --device=cpu or drop "
        "--quantization)"));
  }
  auto engine = std::unique_ptr<Engine>(new Engine());
  engine->options_ = options;
  std::unique_ptr<ModelRunner> runner;
  {
    // The source (and its file mappings) lives only while the runner packs.
    ASSIGN_OR_RETURN(std::unique_ptr<ModelSource> source,
                     OpenModelSource(options.model, options.weight_dtype,
                                     options.synthetic_seed));
    if (source->checkpoint_quant().has_value() && options.device != "cpu") {
      return absl::FailedPreconditionError(absl::StrCat(
          options.model, " is a ", source->checkpoint_quant()->method,
          " quantized checkpoint: quantized weights are CPU-only (use "
          "--device=cpu)"));
    }
    engine->config_ = source->config();
    engine->gen_config_ = source->generation_config();
    if (options.device == "cpu") {
      RETURN_IF_ERROR(CheckMemoryForModel(
          options, source->config(),
          source->checkpoint_quant().has_value()
              ? std::optional<int>(source->checkpoint_quant()->bits)
              : std::nullopt));
    }
    RunnerOptions ro;
    ro.weight_dtype = options.weight_dtype;
    ro.quantization = options.quantization;
    ro.num_threads = options.num_threads;
    ro.max_batch_tokens = options.max_batch_tokens;
    ASSIGN_OR_RETURN(engine->runner_, options.device == "cuda"
                                          ? CreateCudaRunner(*source, ro)
                                          : CreateCpuRunner(*source, ro));
    std::string fp = absl::StrCat(source->fingerprint(), ":",
                                  DTypeName(options.weight_dtype));
    if (options.quantization.has_value()) {
      absl::StrAppend(&fp, ":", options.quantization->ToString());
    }
    if (const std::string n = engine->runner_->numerics(); !n.empty()) {
      absl::StrAppend(&fp, ":", n);
      PDSERVE_LOG_INFO(
          "numerics %s (in the model fingerprint: every worker of a cluster "
          "needs the same setting)",
          n);
    }
    const XXH128_hash_t h = XXH3_128bits(fp.data(), fp.size());
    engine->fingerprint_ = absl::StrFormat("%016x%016x", h.high64, h.low64);
  }
  KvLayout layout;
  layout.num_layers = engine->config_.num_layers;
  layout.num_kv_heads = engine->config_.num_kv_heads;
  layout.head_dim = engine->config_.head_dim;
  layout.block_size = options.block_size;
  layout.dtype = options.kv_dtype.value_or(options.weight_dtype);
  ASSIGN_OR_RETURN(engine->kv_,
                   KvCache::Create(layout, options.kv_cache_bytes));
  RETURN_IF_ERROR(engine->runner_->AttachKvPool(*engine->kv_));
  const int64_t pool_tokens = engine->kv_->total_blocks() * layout.block_size;
  if (pool_tokens < engine->config_.max_position_embeddings) {
    PDSERVE_LOG_WARNING(
        "the KV pool holds %d tokens, less than the model's context of %d: "
        "a request needing more (prompt + max_tokens) is refused "
        "(OUT_OF_RANGE; HTTP 400); raise --kv_cache_memory to serve the "
        "whole context",
        pool_tokens, engine->config_.max_position_embeddings);
  }
  if (options.enable_prefix_caching) {
    engine->kv_->EnablePrefixCache(
        PrefixHashRoot(engine->fingerprint_, layout.dtype, layout.block_size));
  }
  return engine;
}

int64_t Engine::weight_bytes() const { return runner_->weight_bytes(); }
int64_t Engine::weight_bytes_per_pass() const {
  return runner_->weight_bytes_per_pass();
}

absl::StatusOr<SeqId> Engine::CreateSequence() { return kv_->CreateSequence(); }

absl::Status Engine::CheckFitsPool(int64_t tokens) const {
  return CheckRequestFitsPool(tokens, kv_->layout().block_size, total_blocks(),
                              "this worker's");
}

absl::Status Engine::Reserve(SeqId seq, int total_tokens) {
  if (total_tokens > config_.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat(total_tokens, " tokens exceed max_position_embeddings ",
                     config_.max_position_embeddings));
  }
  return kv_->Reserve(seq, total_tokens);
}

int Engine::SequenceLength(SeqId seq) const { return kv_->Length(seq); }

void Engine::FreeSequence(SeqId seq) { kv_->Free(seq); }

absl::StatusOr<int> Engine::AttachCachedPrefix(
    SeqId seq, absl::Span<const int32_t> prompt) {
  const int max_tokens = static_cast<int>(prompt.size()) - 1;
  if (max_tokens < kv_->layout().block_size) {
    // Too short to reuse a block; still validates the sequence.
    if (kv_->Length(seq) < 0) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
    }
    return 0;
  }
  return kv_->AttachPrefix(seq, prompt, max_tokens);
}

absl::Status Engine::PublishPrefix(SeqId seq,
                                   absl::Span<const int32_t> tokens) {
  if (static_cast<int>(tokens.size()) > kv_->Length(seq)) {
    return absl::OutOfRangeError(absl::StrCat(
        tokens.size(), " tokens named, the sequence holds ", kv_->Length(seq)));
  }
  return kv_->RecordTokens(seq, 0, tokens);
}

std::vector<BlockHash> Engine::PrefixBlockHashes(
    absl::Span<const int32_t> tokens, int max_blocks) const {
  return FullBlockHashes(PrefixHashRoot(fingerprint_, kv_->layout().dtype,
                                        kv_->layout().block_size),
                         tokens, kv_->layout().block_size, max_blocks);
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.forward_passes = forward_passes_;
  s.forward_tokens = forward_tokens_;
  s.prefix = kv_->prefix_stats();
  return s;
}

absl::Status Engine::Forward(
    absl::Span<const ForwardItem> items, std::vector<float>* logits,
    const std::function<void(int layer)>& on_layer_done) {
  if (items.empty()) return absl::InvalidArgumentError("empty batch");
  int64_t total = 0;
  std::set<SeqId> seen;
  std::vector<RunnerItem> runner_items;
  runner_items.reserve(items.size());
  for (const ForwardItem& item : items) {
    const int len = kv_->Length(item.seq);
    if (len < 0) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", item.seq));
    }
    if (!seen.insert(item.seq).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", item.seq, " appears twice in one batch"));
    }
    if (item.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", item.seq, ": no tokens to append"));
    }
    for (int32_t t : item.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", t, " outside the vocabulary [0, ",
                         config_.vocab_size, ")"));
      }
    }
    const int64_t end = len + static_cast<int64_t>(item.tokens.size());
    if (end > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", item.seq, " would reach ", end,
                       " tokens, beyond max_position_embeddings ",
                       config_.max_position_embeddings));
    }
    total += static_cast<int64_t>(item.tokens.size());
    runner_items.push_back(
        {item.seq, item.tokens, len, item.want_logits, item.token_logits});
  }
  if (total > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", total, " tokens exceeds max_batch_tokens ",
                     options_.max_batch_tokens));
  }
  for (const RunnerItem& item : runner_items) {
    RETURN_IF_ERROR(kv_->Reserve(
        item.seq, item.start_pos + static_cast<int>(item.tokens.size())));
  }
  logits->resize(items.size() * static_cast<size_t>(config_.vocab_size));
  // Lengths cover the new tokens during the pass, so that on_layer_done can
  // export the layers already written (KV streaming); restored on error.
  for (const RunnerItem& item : runner_items) {
    RETURN_IF_ERROR(kv_->SetLength(
        item.seq, item.start_pos + static_cast<int>(item.tokens.size())));
  }
  absl::Status status =
      runner_->Forward(runner_items, kv_.get(), logits->data(), on_layer_done);
  if (!status.ok()) {
    for (const RunnerItem& item : runner_items) {
      (void)kv_->SetLength(item.seq, item.start_pos);
    }
    return status;
  }
  ++forward_passes_;
  forward_tokens_ += total;
  for (const RunnerItem& item : runner_items) {
    RETURN_IF_ERROR(kv_->RecordTokens(item.seq, item.start_pos, item.tokens));
  }
  return absl::OkStatus();
}

void Engine::ForEachParallel(int n, const std::function<void(int)>& fn) {
  runner_->ForEachParallel(n, fn);
}

absl::Status Engine::ExportLayerKv(SeqId seq, int layer, int begin, int end,
                                   std::string* out, uint64_t* xxh3) const {
  out->resize(end > begin
                  ? kv_->layout().BytesPerTokenPerLayer() * int64_t{end - begin}
                  : 0);
  return ExportLayerKv(seq, layer, begin, end, absl::MakeSpan(*out), xxh3);
}

absl::Status Engine::ExportLayerKv(SeqId seq, int layer, int begin, int end,
                                   absl::Span<char> out, uint64_t* xxh3,
                                   Stores stores) const {
  return runner_->ExportLayerKv(*kv_, seq, layer, begin, end, out, xxh3,
                                stores);
}

absl::Status Engine::ImportLayerKv(SeqId seq, int layer, int begin, int end,
                                   absl::string_view bytes, uint64_t* xxh3) {
  return runner_->ImportLayerKv(*kv_, seq, layer, begin, end, bytes, xxh3);
}

absl::Status Engine::SetSequenceLength(SeqId seq, int length) {
  return kv_->SetLength(seq, length);
}

absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text) {
  const std::string lower =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  absl::string_view s = lower;
  if (s.empty()) return absl::InvalidArgumentError("empty memory size");
  struct Unit {
    const char* suffix;
    double mult;
  };
  static const Unit kUnits[] = {{"kib", 1024.0},
                                {"mib", 1048576.0},
                                {"gib", 1073741824.0},
                                {"tib", 1099511627776.0},
                                {"kb", 1e3},
                                {"mb", 1e6},
                                {"gb", 1e9},
                                {"tb", 1e12},
                                {"k", 1024.0},
                                {"m", 1048576.0},
                                {"g", 1073741824.0},
                                {"t", 1099511627776.0},
                                {"b", 1.0}};
  double mult = 0;  // 0: no unit
  for (const Unit& u : kUnits) {
    if (absl::ConsumeSuffix(&s, u.suffix)) {
      mult = u.mult;
      break;
    }
  }
  double value = 0;
  const bool fraction = mult == 0 && absl::StrContains(s, '.');
  if (!absl::SimpleAtod(s, &value) || !std::isfinite(value) || value <= 0 ||
      (fraction && value >= 1.0) || (mult == 0 && !fraction && value < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad memory size '", text,
        "' (use bytes like 512MiB or 2GiB, or a fraction of the available "
        "memory like 0.2)"));
  }
  ASSIGN_OR_RETURN(const AvailableMemory available, AvailableMemoryNow());
  if (fraction) return static_cast<int64_t>(value * available.bytes);
  const double bytes = value * (mult == 0 ? 1 : mult);
  if (bytes > static_cast<double>(available.bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory size ", text, " exceeds what this process can take: ",
        available.Describe(), "; give less, or a fraction like 0.5"));
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace pdserve
