// Engine: one model (Hugging Face checkpoint or synthetic) on a compute
// backend over a paged KV cache. Forward passes append tokens to sequences and
// return the logits of each item's last token; sequences' KV can be exported
// and imported per layer (the KV transfer between workers).
#ifndef PDSERVE_COMMON_ENGINE_ENGINE_H_
#define PDSERVE_COMMON_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/kv/kv_cache.h"  // SeqId, KvLayout
#include "common/model/config.h"
#include "common/model/dtype.h"
#include "common/model/quantization.h"

namespace pdserve {

class ModelRunner;

// More compute threads than any machine has cores only fails to start them.
inline constexpr int kMaxComputeThreads = 1024;

struct EngineOptions {
  // Hugging Face directory, or "synthetic:llama-110m|llama-1b|llama3-8b".
  std::string model = "models/stories260K";
  DType weight_dtype = DType::kF32;  // compute dtype of the weights (f32|bf16)
  // Weights quantized at load (CPU only). With bf16 the int8/int4 kernels
  // run; with f32 the weights take their quantized values in f32 (reference
  // numerics, f32 speed).
  std::optional<QuantFormat> quantization;
  std::optional<DType> kv_dtype;                // default = weight_dtype
  int64_t kv_cache_bytes = int64_t{256} << 20;  // hard budget of the KV pool
  int block_size = 16;
  int num_threads = 0;          // 0 = all cores; at most kMaxComputeThreads
  int max_batch_tokens = 2048;  // tokens per Forward; sizes workspaces once
  uint64_t synthetic_seed = 0;
  // Registers full KV blocks of computed sequences so that later prompts
  // sharing the prefix can attach them (AttachCachedPrefix).
  bool enable_prefix_caching = true;
  // Compute device: "cpu" (the reference backend) or "cuda" (GPU 0; a
  // FAILED_PRECONDITION without a usable GPU or in a build without CUDA).
  std::string device = "cpu";
};

// Cumulative engine counters.
struct EngineStats {
  int64_t forward_passes = 0;
  int64_t forward_tokens = 0;  // tokens computed (prefill chunks + decodes)
  PrefixCacheStats prefix;     // lookups, hits, evictions, cached blocks
};

// Runs one model over a paged KV pool. NOT thread-safe: one thread drives it
// (the scheduler's loop); Forward uses the backend's internal thread pool.
// Prompt tokens per forward pass at most for a request scoring its prompt
// (ForwardItem.token_logits: this many x vocab floats).
inline constexpr int kPromptLogprobsChunkTokens = 256;

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options);
  ~Engine();

  const ModelConfig& config() const { return config_; }
  const GenerationConfig& generation_config() const { return gen_config_; }
  // Hex XXH3-128 of the model (config, tensor metadata, sampled weight bytes),
  // the weight dtype, the quantization and numerics(): equal fingerprints
  // compute identical KV.
  const std::string& fingerprint() const { return fingerprint_; }
  // What else decides the bits (ModelRunner::numerics, e.g. "bf16-amx");
  // empty when nothing.
  std::string numerics() const;
  const EngineOptions& options() const { return options_; }
  KvLayout kv_layout() const { return kv_->layout(); }
  int64_t total_blocks() const { return kv_->total_blocks(); }
  // Free = blank or cached-but-unreferenced (evictable); used = referenced
  // by a live sequence. A leak check asserts used_blocks() == 0.
  int64_t free_blocks() const { return kv_->free_blocks(); }
  int64_t used_blocks() const { return kv_->used_blocks(); }
  int64_t BlocksFor(int64_t tokens) const { return kv_->BlocksFor(tokens); }
  // OUT_OF_RANGE when `tokens` tokens of KV need more blocks than the whole
  // pool has: no amount of waiting fits them on this worker (a larger one
  // may). Reads only what is fixed at creation: any thread may call it.
  absl::Status CheckFitsPool(int64_t tokens) const;
  // Bytes of weights held (packed/converted copy), for memory accounting.
  int64_t weight_bytes() const;
  // Weight bytes one forward pass streams (decode is bound by these).
  int64_t weight_bytes_per_pass() const;

  // A sequence owns KV blocks for positions [0, length). Reserve grows
  // capacity (Forward also reserves what it needs).
  absl::StatusOr<SeqId> CreateSequence();
  absl::Status Reserve(SeqId seq, int total_tokens);  // RESOURCE_EXHAUSTED
  int SequenceLength(SeqId seq) const;                // -1 if unknown
  void FreeSequence(SeqId seq);                       // idempotent

  // Prefix caching. For a new (empty) sequence: shares the longest run of
  // cached full blocks matching the start of `prompt`, always leaving at
  // least one token to compute (so the pass yields logits), and returns the
  // number of tokens reused (0 when disabled or on a miss); the caller then
  // runs Forward on prompt[reused:]. Reused KV is bit-identical to computed.
  absl::StatusOr<int> AttachCachedPrefix(SeqId seq,
                                         absl::Span<const int32_t> prompt);
  // Forward registers every full block it completes; sequences whose KV was
  // imported (ImportLayerKv) name their tokens here to make it attachable.
  absl::Status PublishPrefix(SeqId seq, absl::Span<const int32_t> tokens);
  // Chained hashes of the first full blocks of `tokens` as this engine's
  // prefix cache keys them (for prefix-aware routing).
  std::vector<BlockHash> PrefixBlockHashes(absl::Span<const int32_t> tokens,
                                           int max_blocks = -1) const;
  EngineStats stats() const;

  // One item of a forward pass: appends `tokens` at positions [len, len+n)
  // of `seq` (prefill: many; decode: one; a chunk of a long prompt: some).
  struct ForwardItem {
    SeqId seq = 0;
    absl::Span<const int32_t> tokens;
    bool want_logits = true;
    // When set: also the logits of every new token, [tokens.size() x
    // vocab], row t bit-identical to the logits of a pass whose chunk ends
    // at token t (prompt logprobs). Callers bound the chunk for memory.
    float* token_logits = nullptr;
  };
  // One forward pass over a batch. `logits` is resized to
  // [items.size() x vocab]: row i holds the logits of item i's LAST new token
  // (left unspecified when want_logits is false). Batch-invariant: an item's
  // logits are bit-identical whatever the other items are and however its
  // earlier tokens were chunked. on_layer_done(layer) runs after each layer's
  // KV of this pass is written (to stream the KV out). Errors leave sequence
  // lengths unchanged.
  absl::Status Forward(
      absl::Span<const ForwardItem> items, std::vector<float>* logits,
      const std::function<void(int layer)>& on_layer_done = nullptr);

  // Runs fn(0..n-1) on the backend's compute threads, each index on one
  // thread (ModelRunner::ForEachParallel): from the driving thread between
  // passes or from on_layer_done. `fn` may call the const KV exports below
  // concurrently (each into its own buffer), nothing else of the engine.
  void ForEachParallel(int n, const std::function<void(int)>& fn);

  // KV wire access, per layer, tokens [begin, end): K bytes then V bytes,
  // each [tokens][kv_heads][head_dim] in the KV dtype. `xxh3` (optional):
  // KvChecksum of the bytes, computed on the way (KvCache::ExportLayer).
  absl::Status ExportLayerKv(SeqId seq, int layer, int begin, int end,
                             std::string* out, uint64_t* xxh3 = nullptr) const;
  // Into `out` of exactly kv_layout().BytesPerTokenPerLayer() * (end -
  // begin) bytes (memory the KV transport registered, for one), written
  // with `stores` (KvCache::ExportLayer).
  absl::Status ExportLayerKv(SeqId seq, int layer, int begin, int end,
                             absl::Span<char> out, uint64_t* xxh3 = nullptr,
                             Stores stores = Stores::kCached) const;
  absl::Status ImportLayerKv(SeqId seq, int layer, int begin, int end,
                             absl::string_view bytes, uint64_t* xxh3 = nullptr);
  // Sets the length after importing all layers (capacity must cover it).
  absl::Status SetSequenceLength(SeqId seq, int length);

 private:
  Engine() = default;

  EngineOptions options_;
  ModelConfig config_;
  GenerationConfig gen_config_;
  std::string fingerprint_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<ModelRunner> runner_;
  int64_t forward_passes_ = 0;
  int64_t forward_tokens_ = 0;
};

// Parses "512MiB", "2GiB", "1000000", "1.5GB" (bytes) or a fraction in (0, 1)
// of the memory available now (MemAvailable, capped by a cgroup's limit:
// common/util/system_memory.h). A size above what is available is
// RESOURCE_EXHAUSTED (the pool is touched at creation: the worker would be
// OOM-killed).
absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_ENGINE_H_
