// The backend's kernel interface: a ModelRunner owns a model's weights in the
// layout its kernels want and runs one forward pass over a batch of sequence
// chunks, reading and writing the paged KV cache. cpu/ and cuda/ implement it.
// Not thread-safe: one thread drives it (it may use its own pool).
#ifndef PDSERVE_COMMON_BACKEND_MODEL_RUNNER_H_
#define PDSERVE_COMMON_BACKEND_MODEL_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/kv/kv_cache.h"
#include "common/model/model_source.h"
#include "common/model/quantization.h"

namespace pdserve {

// One sequence's chunk: tokens at positions [start_pos, start_pos + n). The
// sequence's capacity in `kv` must already cover them.
struct RunnerItem {
  SeqId seq = 0;
  absl::Span<const int32_t> tokens;
  int start_pos = 0;
  bool want_logits = true;
  // When set: the logits of every token of the chunk, [tokens.size() x
  // vocab] (prompt logprobs); row t's bits equal what the logits of a chunk
  // ending at token t would be. Runners that cannot: UNIMPLEMENTED.
  float* token_logits = nullptr;
};

struct RunnerOptions {
  DType weight_dtype = DType::kF32;
  // Linear layers (and the lm_head, at int8) quantized at load; CPU only.
  std::optional<QuantFormat> quantization;
  int num_threads = 0;
  int max_batch_tokens = 2048;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Writes each item's KV and, for items wanting them, the logits of its last
  // token into logits[i * vocab ...]. Inputs are validated by the caller.
  virtual absl::Status Forward(
      absl::Span<const RunnerItem> items, KvCache* kv, float* logits,
      const std::function<void(int layer)>& on_layer_done) = 0;
  virtual int64_t weight_bytes() const = 0;
  // Weight bytes one forward pass reads (all but an untied embedding table).
  virtual int64_t weight_bytes_per_pass() const = 0;
  virtual int num_threads() const = 0;
  // Runs fn(i) for every i in [0, n), each on one of the compute threads,
  // and returns when all have run: for per-chunk work between the layers of
  // a pass (on_layer_done) or between passes, never inside Forward's own
  // parallel work. The default runs them in order on the calling thread.
  virtual void ForEachParallel(int n, const std::function<void(int)>& fn) {
    for (int i = 0; i < n; ++i) fn(i);
  }
  // What else decides this runner's bits beyond the model, dtype and
  // quantization (e.g. "bf16-amx": AMX's sums, which depend on the CPU);
  // empty when nothing. Part of the engine's fingerprint.
  virtual std::string numerics() const { return ""; }

  // ---- Where the KV data lives. The engine calls these instead of the
  // KvCache's own methods. The defaults keep the data in the host pool (CPU);
  // a device backend that mirrors the pool in device memory (same block ids,
  // same per-block layout) overrides them. The KvCache stays the owner of
  // the block tables and lengths either way.
  // Called once, right after the engine created `kv`, before any Forward.
  virtual absl::Status AttachKvPool(const KvCache& kv) {
    return absl::OkStatus();
  }
  // KvCache::ExportLayer / ImportLayer semantics and wire layout (`xxh3`
  // optional: KvChecksum of the bytes; `stores`: how `out` is written, a
  // hint a backend copying from elsewhere may ignore).
  virtual absl::Status ExportLayerKv(const KvCache& kv, SeqId seq, int layer,
                                     int begin, int end, absl::Span<char> out,
                                     uint64_t* xxh3, Stores stores) {
    return kv.ExportLayer(seq, layer, begin, end, out, xxh3, stores);
  }
  virtual absl::Status ImportLayerKv(KvCache& kv, SeqId seq, int layer,
                                     int begin, int end,
                                     absl::string_view bytes, uint64_t* xxh3) {
    return kv.ImportLayer(seq, layer, begin, end, bytes, xxh3);
  }
};

// Reads every tensor from `source` once, converting/packing it; the source
// can be dropped afterwards (releasing its mappings).
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuRunner(
    ModelSource& source, const RunnerOptions& options);

// The CUDA backend (cuda/cuda_runner.cc) on device 0: weights uploaded once,
// the KV pool mirrored in device memory. FAILED_PRECONDITION "--device=cuda
// but no CUDA device: ..." without a usable GPU, or "... built without CUDA"
// in a build without the CUDA backend (cuda/cuda_stub.cc).
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(
    ModelSource& source, const RunnerOptions& options);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_MODEL_RUNNER_H_
