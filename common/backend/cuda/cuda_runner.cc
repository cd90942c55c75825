// The Llama-family forward pass on a CUDA device: cuBLAS for the matrix
// products, kernels.cuh for the rest, KV in a device mirror of the host pool.
//
// NOT YET RUN ON A GPU. This file compiles against CUDA 13.0 (sm_90) but has
// never executed; tests/unit/cuda_runner_test.cc and scripts/gpu_check.sh are
// what a GPU session runs to verify it.
//
// Numerics vs the CPU backend: f32 weights use cuBLAS f32 GEMMs (no TF32), so
// logits agree to ~1e-5 relative; bf16 weights feed cuBLAS bf16 x bf16 with
// f32 accumulation, which rounds the activations entering each GEMM to bf16
// (the CPU keeps them f32): logits agree to ~1e-2. Batch invariance holds for
// the own kernels by construction but NOT for cuBLAS, whose algorithm choice
// may depend on the number of rows (not yet measured).
#include "common/backend/cuda/cuda_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace pdserve {
namespace cuda {

CudaRunner::~CudaRunner() {
  // Buffers free themselves after this (members); wait for pending work.
  if (compute_ != nullptr) cudaStreamSynchronize(compute_);
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  for (cudaEvent_t e : layer_done_) cudaEventDestroy(e);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (compute_ != nullptr) cudaStreamDestroy(compute_);
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
}

absl::Status CudaRunner::Init() {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(0), "cudaSetDevice(0)"));
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "stream"));
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "stream"));
  RETURN_IF_ERROR(CublasStatus(cublasCreate(&cublas_), "cublasCreate"));
  RETURN_IF_ERROR(
      CublasStatus(cublasSetStream(cublas_, compute_), "cublasSetStream"));
  RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH),
                               "cublasSetMathMode"));
  layer_done_.resize(config_.num_layers, nullptr);
  for (cudaEvent_t& e : layer_done_) {
    RETURN_IF_ERROR(CudaStatus(
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DevicePtr> CudaRunner::LoadVector(ModelSource& source,
                                                 const std::string& name,
                                                 int64_t size) {
  ASSIGN_OR_RETURN(WeightView w, source.Get(name, {size}));
  std::vector<float> v(size);
  ConvertToF32(w.dtype, w.data, size, v.data());
  if (bf16()) {
    for (float& f : v) f = RoundToBf16(f);  // as the CPU backend
  }
  ASSIGN_OR_RETURN(DevicePtr d, cuda::DeviceAlloc(size * 4, name));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(d.get(), v.data(), size * 4, cudaMemcpyHostToDevice), name));
  weight_bytes_ += size * 4;
  return d;
}

absl::StatusOr<DevicePtr> CudaRunner::LoadBiases(
    ModelSource& source, const std::vector<std::string>& names,
    const std::vector<int64_t>& sizes) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  ASSIGN_OR_RETURN(DevicePtr d, cuda::DeviceAlloc(total * 4, names[0]));
  int64_t off = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(DevicePtr part, LoadVector(source, names[i], sizes[i]));
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(static_cast<float*>(d.get()) + off, part.get(),
                              sizes[i] * 4, cudaMemcpyDeviceToDevice),
                   names[i]));
    off += sizes[i];
    weight_bytes_ -= sizes[i] * 4;  // counted once, below
  }
  weight_bytes_ += total * 4;
  return d;
}

absl::Status CudaRunner::LoadMatrix(ModelSource& source,
                                    const std::vector<std::string>& names,
                                    const std::vector<int64_t>& rows, int64_t k,
                                    DeviceMatrix* out) {
  const int esize = bf16() ? 2 : 4;
  out->n = 0;
  for (int64_t r : rows) out->n += r;
  out->k = k;
  out->bytes = out->n * k * esize;
  ASSIGN_OR_RETURN(out->data, cuda::DeviceAlloc(out->bytes, names[0]));
  char* dst = static_cast<char*>(out->data.get());
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(WeightView w, source.Get(names[i], {rows[i], k}));
    const int64_t n = rows[i] * k;
    const void* host = w.data;
    if (!((w.dtype == DType::kBF16 && bf16()) ||
          (w.dtype == DType::kF32 && !bf16()))) {
      f32.resize(n);
      ConvertToF32(w.dtype, w.data, n, f32.data());
      host = f32.data();
      if (bf16()) {
        b16.resize(n);
        for (int64_t j = 0; j < n; ++j) b16[j] = ::pdserve::F32ToBf16(f32[j]);
        host = b16.data();
      }
    }
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(dst, host, n * esize, cudaMemcpyHostToDevice), names[i]));
    dst += n * esize;
  }
  weight_bytes_ += out->bytes;
  return absl::OkStatus();
}

absl::Status CudaRunner::Load(ModelSource& source) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[l];
    const LayerTensors t = DescribeLayerTensors(c, l);
    ASSIGN_OR_RETURN(L.attn_norm, LoadVector(source, t.attn_norm, H));
    ASSIGN_OR_RETURN(L.mlp_norm, LoadVector(source, t.mlp_norm, H));
    RETURN_IF_ERROR(
        LoadMatrix(source, t.qkv.names, t.qkv.rows, t.qkv.cols, &L.qkv));
    RETURN_IF_ERROR(LoadMatrix(source, t.o.names, t.o.rows, t.o.cols, &L.o));
    RETURN_IF_ERROR(LoadMatrix(source, t.gate_up.names, t.gate_up.rows,
                               t.gate_up.cols, &L.gate_up));
    RETURN_IF_ERROR(
        LoadMatrix(source, t.down.names, t.down.rows, t.down.cols, &L.down));
    if (t.qkv_bias) {
      ASSIGN_OR_RETURN(L.qkv_bias,
                       LoadBiases(source, t.qkv_bias->names, t.qkv_bias->rows));
    }
    if (t.o_bias) {
      ASSIGN_OR_RETURN(L.o_bias,
                       LoadBiases(source, t.o_bias->names, t.o_bias->rows));
    }
    if (t.gate_up_bias) {
      ASSIGN_OR_RETURN(L.gate_up_bias, LoadBiases(source, t.gate_up_bias->names,
                                                  t.gate_up_bias->rows));
    }
    if (t.down_bias) {
      ASSIGN_OR_RETURN(L.down_bias, LoadBiases(source, t.down_bias->names,
                                               t.down_bias->rows));
    }
    L.window = c.layer_sliding_window.empty() ? 0 : c.layer_sliding_window[l];
  }
  ASSIGN_OR_RETURN(final_norm_, LoadVector(source, "model.norm.weight", H));
  RETURN_IF_ERROR(LoadMatrix(source, {"model.embed_tokens.weight"},
                             {c.vocab_size}, H, &embed_));
  if (c.tie_word_embeddings) {
    lm_head_ = &embed_;
  } else {
    RETURN_IF_ERROR(LoadMatrix(source, {"lm_head.weight"}, {c.vocab_size}, H,
                               &lm_head_storage_));
    lm_head_ = &lm_head_storage_;
  }
  // The CPU's inverse frequencies, uploaded once (angles are computed on the
  // device from them exactly as RopeAngles does on the host).
  const std::vector<float> inv_freq = RopeInvFreq(c);
  ASSIGN_OR_RETURN(inv_freq_,
                   cuda::DeviceAlloc(inv_freq.size() * 4, "inv_freq"));
  return CudaStatus(cudaMemcpy(inv_freq_.get(), inv_freq.data(),
                               inv_freq.size() * 4, cudaMemcpyHostToDevice),
                    "inv_freq");
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CudaRunner::Create(
    ModelSource& source, const RunnerOptions& options) {
  RETURN_IF_ERROR(cuda::CheckDevicePresent());
  if (options.weight_dtype == DType::kF16) {
    return absl::InvalidArgumentError("compute dtype must be f32 or bf16");
  }
  const ModelConfig& c = source.config();
  if (c.head_dim > 256 || c.head_dim % 2 != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA attention kernel supports even head_dim <= 256, got ",
        c.head_dim));
  }
  auto runner =
      std::unique_ptr<CudaRunner>(new CudaRunner(source.config(), options));
  RETURN_IF_ERROR(runner->Init());
  RETURN_IF_ERROR(runner->Load(source));
  const int64_t T = std::max(1, options.max_batch_tokens);
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim();
  const int64_t NQKV = Q + 2 * c.kv_dim();
  ASSIGN_OR_RETURN(runner->x_, cuda::DeviceAlloc(T * H * 4, "x"));
  ASSIGN_OR_RETURN(runner->xn_, cuda::DeviceAlloc(T * H * 4, "xn"));
  ASSIGN_OR_RETURN(runner->qkv_, cuda::DeviceAlloc(T * NQKV * 4, "qkv"));
  ASSIGN_OR_RETURN(runner->attn_, cuda::DeviceAlloc(T * Q * 4, "attn"));
  ASSIGN_OR_RETURN(runner->gu_, cuda::DeviceAlloc(T * 2 * I * 4, "gate_up"));
  ASSIGN_OR_RETURN(runner->act_, cuda::DeviceAlloc(T * I * 4, "act"));
  if (runner->bf16()) {
    ASSIGN_OR_RETURN(runner->xb_,
                     cuda::DeviceAlloc(T * std::max({H, I, Q}) * 2, "x bf16"));
  }
  // Logits are computed in chunks of at most 256 rows.
  runner->logits_rows_ = std::min<int64_t>(T, 256);
  ASSIGN_OR_RETURN(
      runner->logits_,
      cuda::DeviceAlloc(runner->logits_rows_ * c.vocab_size * 4, "logits"));
  RETURN_IF_ERROR(runner->EnsureMeta(8 * T + 1024));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

namespace {
// Keys per split of a long decode row (kernels.cuh, kAttentionSplitKeys);
// PDSERVE_CUDA_ATTENTION_SPLIT=0 turns splitting off and =N (a multiple of
// 32) sets it, for A/B runs (scripts/gpu_check.sh) — read once.
int AttentionSplitKeys() {
  static const int keys = [] {
    const char* v = std::getenv("PDSERVE_CUDA_ATTENTION_SPLIT");
    int n = 0;
    if (v == nullptr || !absl::SimpleAtoi(v, &n) || n < 0 || n % 32 != 0) {
      return kAttentionSplitKeys;
    }
    return n;
  }();
  return keys;
}
}  // namespace

absl::Status CudaRunner::EnsureMeta(int64_t ints) {
  if (ints <= meta_capacity_) return absl::OkStatus();
  const int64_t cap = std::max(ints, 2 * meta_capacity_);
  meta_host_.reset();
  meta_dev_.reset();
  ASSIGN_OR_RETURN(meta_host_, cuda::PinnedAlloc(cap * 4, "metadata"));
  ASSIGN_OR_RETURN(meta_dev_, cuda::DeviceAlloc(cap * 4, "metadata"));
  meta_capacity_ = cap;
  return absl::OkStatus();
}

absl::Status CudaRunner::EnsureLogitsHost(int64_t floats) {
  if (floats <= logits_host_capacity_) return absl::OkStatus();
  logits_host_.reset();
  ASSIGN_OR_RETURN(logits_host_, cuda::PinnedAlloc(floats * 4, "logits"));
  logits_host_capacity_ = floats;
  return absl::OkStatus();
}

absl::Status CudaRunner::EnsureStaging(int64_t bytes) {
  if (bytes <= staging_capacity_) return absl::OkStatus();
  const int64_t cap = std::max(bytes, 2 * staging_capacity_);
  staging_.reset();
  ASSIGN_OR_RETURN(staging_, cuda::PinnedAlloc(cap, "KV staging"));
  staging_capacity_ = cap;
  return absl::OkStatus();
}

absl::Status CudaRunner::Gemm(const float* x, int64_t M, const DeviceMatrix& w,
                              const DevicePtr& bias, float* y, int64_t ldy) {
  const void* in = x;
  if (bf16()) {
    uint16_t* xb = static_cast<uint16_t*>(xb_.get());
    RETURN_IF_ERROR(
        CudaStatus(cuda::F32ToBf16(x, M * w.k, xb, compute_), "F32ToBf16"));
    in = xb;
  }
  RETURN_IF_ERROR(cuda::GemmRowMajor(cublas_, in, w.data.get(), bf16(), M, w.n,
                                     w.k, y, ldy));
  if (bias) {
    RETURN_IF_ERROR(CudaStatus(
        cuda::AddBias(y, ldy, static_cast<const float*>(bias.get()),
                      static_cast<int>(M), static_cast<int>(w.n), compute_),
        "AddBias"));
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::Forward(
    absl::Span<const RunnerItem> items, KvCache* kv, float* logits,
    const std::function<void(int layer)>& on_layer_done) {
  if (pool_view_.base == nullptr) {
    return absl::FailedPreconditionError("CUDA runner: no KV pool attached");
  }
  const ModelConfig& c = config_;
  const int H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int Q = c.q_dim(), NQKV = Q + 2 * c.kv_dim();
  const int bs = kv->layout().block_size;
  // Host metadata: per row token, position, block id, offset; attention
  // tiles; the block tables; the rows whose logits are wanted, and where
  // each row's logits go on the host.
  std::vector<int32_t> tokens, positions, block_ids, offsets, tables, wanted;
  std::vector<cuda::AttentionTile> tiles;
  std::vector<float*> wanted_dest;
  const int64_t V = c.vocab_size;
  for (size_t i = 0; i < items.size(); ++i) {
    const RunnerItem& item = items[i];
    const std::vector<int32_t>* table = kv->BlockTable(item.seq);
    if (table == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", item.seq));
    }
    const int n = static_cast<int>(item.tokens.size());
    const int row0 = static_cast<int>(tokens.size());
    const int table_offset = static_cast<int>(tables.size());
    tables.insert(tables.end(), table->begin(), table->end());
    for (int t = 0; t < n; ++t) {
      const int pos = item.start_pos + t;
      tokens.push_back(item.tokens[t]);
      positions.push_back(pos);
      block_ids.push_back((*table)[pos / bs]);
      offsets.push_back(pos % bs);
    }
    for (int t = 0; t < n; t += cuda::kAttentionRowsPerTile) {
      tiles.push_back({row0 + t, std::min(cuda::kAttentionRowsPerTile, n - t),
                       item.start_pos + t, table_offset});
    }
    // Prompt logprobs: every row through the same final norm and lm_head
    // as a last row (whole logits on CUDA are cuBLAS's, see DESIGN.md).
    if (item.token_logits != nullptr) {
      for (int t = 0; t < n; ++t) {
        wanted.push_back(row0 + t);
        wanted_dest.push_back(item.token_logits + t * V);
      }
    }
    if (item.want_logits && n > 0) {
      wanted.push_back(row0 + n - 1);
      wanted_dest.push_back(logits + i * V);
    }
  }
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (T > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", T, " tokens exceeds max_batch_tokens ",
                     options_.max_batch_tokens));
  }
  static_assert(sizeof(cuda::AttentionTile) == 4 * sizeof(int32_t));
  const int split_keys = AttentionSplitKeys();
  const cuda::AttentionSplitPlan split =
      cuda::PlanAttentionSplits(tiles, split_keys);
  if (split.slots > 0) {
    const int64_t bytes = split.slots * c.num_heads * (D + 2) * 4;
    if (bytes > attn_partial_capacity_) {
      // The stream is idle here (every Forward ends synchronized).
      attn_partial_.reset();
      attn_partial_capacity_ = 0;
      ASSIGN_OR_RETURN(attn_partial_,
                       cuda::DeviceAlloc(bytes, "attention partials"));
      attn_partial_capacity_ = bytes;
    }
  }
  const int64_t n_meta = 4 * T + 5 * static_cast<int64_t>(tiles.size()) +
                         static_cast<int64_t>(tables.size() + wanted.size());
  RETURN_IF_ERROR(EnsureMeta(n_meta));
  int32_t* host = static_cast<int32_t*>(meta_host_.get());
  int32_t* dev = static_cast<int32_t*>(meta_dev_.get());
  int64_t at = 0;
  auto put = [&](const void* src, int64_t ints) {
    if (ints > 0) std::memcpy(host + at, src, ints * 4);
    const int32_t* d = dev + at;
    at += ints;
    return d;
  };
  const int32_t* d_tokens = put(tokens.data(), T);
  const int32_t* d_positions = put(positions.data(), T);
  const int32_t* d_block_ids = put(block_ids.data(), T);
  const int32_t* d_offsets = put(offsets.data(), T);
  const auto* d_tiles = reinterpret_cast<const cuda::AttentionTile*>(
      put(tiles.data(), 4 * static_cast<int64_t>(tiles.size())));
  const int32_t* d_tables = put(tables.data(), tables.size());
  const int32_t* d_wanted = put(wanted.data(), wanted.size());
  const int32_t* d_split_base = put(split.base.data(), split.base.size());
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(dev, host, at * 4, cudaMemcpyHostToDevice, compute_),
      "metadata upload"));

  float* x = static_cast<float*>(x_.get());
  float* xn = static_cast<float*>(xn_.get());
  float* qkv = static_cast<float*>(qkv_.get());
  float* attn = static_cast<float*>(attn_.get());
  float* gu = static_cast<float*>(gu_.get());
  float* act = static_cast<float*>(act_.get());
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  RETURN_IF_ERROR(CudaStatus(cuda::EmbeddingGather(embed_.data.get(), bf16(),
                                                   d_tokens, T, H, x, compute_),
                             "EmbeddingGather"));
  auto norm = [&](const DevicePtr& w, const float* in) {
    return CudaStatus(
        cuda::RmsNorm(in, H, nullptr, T, H, static_cast<const float*>(w.get()),
                      eps, xn, compute_),
        "RmsNorm");
  };
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    RETURN_IF_ERROR(norm(L.attn_norm, x));
    RETURN_IF_ERROR(Gemm(xn, T, L.qkv, L.qkv_bias, qkv, NQKV));
    RETURN_IF_ERROR(CudaStatus(
        cuda::RopeAndStoreKv(qkv, d_positions, d_block_ids, d_offsets, T,
                             c.num_heads,
                             static_cast<const float*>(inv_freq_.get()),
                             pool_view_, l, compute_),
        "RopeAndStoreKv"));
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(layer_done_[l], compute_),
                               "cudaEventRecord"));
    RETURN_IF_ERROR(CudaStatus(
        cuda::Attention(
            qkv, NQKV, d_tiles, static_cast<int>(tiles.size()), d_tables,
            pool_view_, l, c.num_heads, L.window, scale, attn, compute_,
            split.slots > 0 ? d_split_base : nullptr, split.max_splits,
            split_keys, static_cast<float*>(attn_partial_.get())),
        "Attention"));
    RETURN_IF_ERROR(Gemm(attn, T, L.o, L.o_bias, xn, H));
    RETURN_IF_ERROR(
        CudaStatus(cuda::AddInPlace(x, xn, T * H, compute_), "AddInPlace"));
    RETURN_IF_ERROR(norm(L.mlp_norm, x));
    RETURN_IF_ERROR(Gemm(xn, T, L.gate_up, L.gate_up_bias, gu, 2 * I));
    RETURN_IF_ERROR(
        CudaStatus(cuda::SiluMul(gu, T, I, act, compute_), "SiluMul"));
    RETURN_IF_ERROR(Gemm(act, T, L.down, L.down_bias, xn, H));
    RETURN_IF_ERROR(
        CudaStatus(cuda::AddInPlace(x, xn, T * H, compute_), "AddInPlace"));
  }
  // Final norm and lm_head for the wanted rows, in chunks of logits_rows_,
  // copied back into pinned memory (sampling runs on the host).
  float* dlogits = static_cast<float*>(logits_.get());
  const int64_t n_wanted = static_cast<int64_t>(wanted.size());
  RETURN_IF_ERROR(EnsureLogitsHost(std::min(n_wanted, logits_rows_) * V));
  float* hlogits = static_cast<float*>(logits_host_.get());
  auto scatter = [&](int64_t w0, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(wanted_dest[w0 + j], hlogits + j * V, V * 4);
    }
  };
  int64_t last_w0 = 0, last_n = 0;
  for (int64_t w0 = 0; w0 < n_wanted; w0 += logits_rows_) {
    if (last_n > 0) {  // the previous chunk's buffers are reused
      RETURN_IF_ERROR(
          CudaStatus(cudaStreamSynchronize(compute_), "synchronize"));
      scatter(last_w0, last_n);
    }
    const int64_t n = std::min(logits_rows_, n_wanted - w0);
    RETURN_IF_ERROR(
        CudaStatus(cuda::RmsNorm(x, H, d_wanted + w0, static_cast<int>(n), H,
                                 static_cast<const float*>(final_norm_.get()),
                                 eps, xn, compute_),
                   "RmsNorm"));
    RETURN_IF_ERROR(Gemm(xn, n, *lm_head_, DevicePtr(), dlogits, V));
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(hlogits, dlogits, n * V * 4,
                                   cudaMemcpyDeviceToHost, compute_),
                   "logits copy"));
    last_w0 = w0;
    last_n = n;
  }
  // Everything is enqueued (for up to logits_rows_ wanted rows); report each
  // layer once its KV is written while the device computes the later layers
  // (KV streaming overlaps compute).
  for (int l = 0; l < c.num_layers; ++l) {
    RETURN_IF_ERROR(
        CudaStatus(cudaEventSynchronize(layer_done_[l]), "layer event"));
    if (on_layer_done) on_layer_done(l);
  }
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(compute_), "forward"));
  scatter(last_w0, last_n);
  return absl::OkStatus();
}

}  // namespace cuda

namespace cuda_impl {
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(
    ModelSource& source, const RunnerOptions& options) {
  return cuda::CudaRunner::Create(source, options);
}
}  // namespace cuda_impl

}  // namespace pdserve
