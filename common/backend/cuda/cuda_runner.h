// The CUDA ModelRunner (internal to common/backend/cuda): the class is
// shared by cuda_runner.cc (weights, workspaces, the forward pass) and
// cuda_runner_kv.cc (the device mirror of the KV pool: attach, export,
// import through pinned staging on the copy stream).
//
// NOT YET RUN ON A GPU (compiled with nvcc 13.0 / CUDA 13 headers only).
#ifndef PDSERVE_COMMON_BACKEND_CUDA_CUDA_RUNNER_H_
#define PDSERVE_COMMON_BACKEND_CUDA_CUDA_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/backend/cuda/cuda_util.h"
#include "common/backend/cuda/kernels.cuh"
#include "common/backend/model_runner.h"

namespace pdserve {
namespace cuda {

// A weight matrix [n][k] (Hugging Face layout, parts stacked along n) in the
// weight dtype, in device memory.
struct DeviceMatrix {
  DevicePtr data;
  int64_t n = 0, k = 0, bytes = 0;
};

// Owns the device weights, workspaces (sized once from max_batch_tokens),
// the device KV pool, streams and the cuBLAS handle. Not thread-safe: one
// driving thread (the engine's).
class CudaRunner : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(
      ModelSource& source, const RunnerOptions& options);
  ~CudaRunner() override;

  absl::Status Forward(
      absl::Span<const RunnerItem> items, KvCache* kv, float* logits,
      const std::function<void(int layer)>& on_layer_done) override;
  int64_t weight_bytes() const override { return weight_bytes_; }
  int64_t weight_bytes_per_pass() const override {
    return lm_head_ == &embed_ ? weight_bytes_ : weight_bytes_ - embed_.bytes;
  }
  int num_threads() const override { return 1; }
  absl::Status AttachKvPool(const KvCache& kv) override;
  // `stores` is ignored: the bytes come from device memory.
  absl::Status ExportLayerKv(const KvCache& kv, SeqId seq, int layer, int begin,
                             int end, absl::Span<char> out, uint64_t* xxh3,
                             Stores stores) override;
  absl::Status ImportLayerKv(KvCache& kv, SeqId seq, int layer, int begin,
                             int end, absl::string_view bytes,
                             uint64_t* xxh3) override;

 private:
  struct Layer {
    DevicePtr attn_norm, mlp_norm;  // f32 [H]
    DeviceMatrix qkv, o, gate_up, down;
    DevicePtr qkv_bias, o_bias, gate_up_bias, down_bias;  // f32 or null
    int window = 0;
  };

  CudaRunner(const ModelConfig& config, const RunnerOptions& options)
      : config_(config), options_(options) {}
  bool bf16() const { return options_.weight_dtype == DType::kBF16; }
  absl::Status Init();
  absl::Status Load(ModelSource& source);
  absl::StatusOr<DevicePtr> LoadVector(ModelSource& source,
                                       const std::string& name, int64_t size);
  absl::StatusOr<DevicePtr> LoadBiases(ModelSource& source,
                                       const std::vector<std::string>& names,
                                       const std::vector<int64_t>& sizes);
  absl::Status LoadMatrix(ModelSource& source,
                          const std::vector<std::string>& names,
                          const std::vector<int64_t>& rows, int64_t k,
                          DeviceMatrix* out);
  // y[M][N] = x[M][K] . w^T (+ bias); x is f32 (converted to bf16 first
  // when the weights are bf16).
  absl::Status Gemm(const float* x, int64_t M, const DeviceMatrix& w,
                    const DevicePtr& bias, float* y, int64_t ldy);
  // Grows the pinned host and device metadata buffers to `ints` int32s.
  absl::Status EnsureMeta(int64_t ints);
  absl::Status EnsureStaging(int64_t bytes);
  absl::Status EnsureLogitsHost(int64_t floats);
  // Checks a wire-format range against the host pool's bookkeeping.
  absl::Status CheckRange(const KvCache& kv, SeqId seq, int layer, int begin,
                          int end, int limit) const;
  // Copies rows [begin, end) of `layer` between the device pool and the
  // staging buffer (K rows then V rows), on the copy stream, and waits.
  absl::Status CopyRows(const std::vector<int32_t>& table, int layer, int begin,
                        int end, bool to_device);

  const ModelConfig config_;
  const RunnerOptions options_;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::vector<cudaEvent_t> layer_done_;
  std::vector<Layer> layers_;
  DeviceMatrix embed_, lm_head_storage_;
  const DeviceMatrix* lm_head_ = nullptr;
  DevicePtr final_norm_, inv_freq_;
  int64_t weight_bytes_ = 0;
  // Workspaces (device).
  DevicePtr x_, xn_, qkv_, attn_, gu_, act_, xb_, logits_;
  int64_t logits_rows_ = 0;
  DevicePtr meta_dev_;
  PinnedPtr meta_host_;
  int64_t meta_capacity_ = 0;
  // Partials of decode rows split along the keys (kernels.cuh), grown on
  // demand.
  DevicePtr attn_partial_;
  int64_t attn_partial_capacity_ = 0;
  PinnedPtr staging_;
  PinnedPtr logits_host_;  // pinned landing of the logits copy
  int64_t logits_host_capacity_ = 0;
  int64_t staging_capacity_ = 0;
  // The device KV pool.
  DevicePtr pool_;
  cuda::KvPoolView pool_view_;
  int64_t row_bytes_ = 0;
};

}  // namespace cuda
}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CUDA_CUDA_RUNNER_H_
