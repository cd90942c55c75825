// The Llama-family transformer forward pass on the CPU kernels.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/attention_pass.h"
#include "common/backend/cpu/kernels.h"
#include "common/backend/cpu/packed_matrix.h"
#include "common/backend/cpu/quantized_matrix.h"
#include "common/backend/model_runner.h"
#include "common/backend/thread_pool.h"
#include "common/util/status_macros.h"

namespace pdserve {
namespace {

// A weight matrix in its kernel's layout: packed f32/bf16 or quantized.
// A GPTQ act-order matrix has its inputs permuted so that its groups are
// contiguous: input k of the kernel is x[perm[k]].
struct Linear {
  PackedMatrix dense;
  QuantizedMatrix quant;
  bool quantized = false;
  std::vector<int32_t> perm;
  int64_t bytes() const { return quantized ? quant.bytes() : dense.bytes(); }
};

void LinearMatMul(ThreadPool& pool, const float* x, int64_t M, int64_t ldx,
                  const Linear& w, const float* bias, float* y, int64_t ldy) {
  if (w.quantized) {
    if (!w.perm.empty()) {
      thread_local std::vector<float> gathered;
      const int64_t K = static_cast<int64_t>(w.perm.size());
      if (static_cast<int64_t>(gathered.size()) < M * K) gathered.resize(M * K);
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t k = 0; k < K; ++k) {
          gathered[m * K + k] = x[m * ldx + w.perm[k]];
        }
      }
      QuantMatMul(pool, gathered.data(), M, K, w.quant, bias, y, ldy);
      return;
    }
    QuantMatMul(pool, x, M, ldx, w.quant, bias, y, ldy);
  } else {
    MatMul(pool, x, M, ldx, w.dense, bias, y, ldy);
  }
}

// Owns the packed weights and the workspaces (sized once from
// max_batch_tokens). Not thread-safe: one driving thread.
class CpuRunner : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(
      ModelSource& source, const RunnerOptions& options);

  absl::Status Forward(
      absl::Span<const RunnerItem> items, KvCache* kv, float* logits,
      const std::function<void(int layer)>& on_layer_done) override;
  int64_t weight_bytes() const override { return weight_bytes_; }
  int64_t weight_bytes_per_pass() const override {
    // The embedding table is read a row per token, unless it is the lm_head.
    return lm_head_ == &embed_ ? weight_bytes_ : weight_bytes_ - embed_.bytes();
  }
  int num_threads() const override { return pool_->num_threads(); }
  void ForEachParallel(int n, const std::function<void(int)>& fn) override {
    ParallelRows(n, [&](int64_t i) { fn(static_cast<int>(i)); });
  }
  std::string numerics() const override {
    return options_.weight_dtype == DType::kBF16 && UseAmxBf16() ? "bf16-amx"
                                                                 : "";
  }

 private:
  struct Layer {
    std::vector<float> attn_norm, mlp_norm;
    Linear qkv, o, gate_up, down;
    std::vector<float> qkv_bias, o_bias, gate_up_bias, down_bias;
    int window = 0;
  };
  struct Row {
    const std::vector<int32_t>* table;
    int32_t token;
    int pos;
  };
  CpuRunner(const ModelConfig& config, const RunnerOptions& options)
      : config_(config), options_(options) {}
  absl::Status Load(ModelSource& source);
  absl::StatusOr<std::vector<float>> LoadVector(ModelSource& source,
                                                const std::string& name,
                                                int64_t size);
  // Parts stored quantized in a GPTQ/AWQ checkpoint (some or all).
  absl::Status LoadCheckpointQuantized(ModelSource& source,
                                       const std::vector<std::string>& names,
                                       const std::vector<int64_t>& rows,
                                       int64_t k, Linear* out);
  // quant: the format to quantize to (nullopt: --dtype as is).
  absl::Status LoadMatrix(ModelSource& source,
                          const std::vector<std::string>& names,
                          const std::vector<int64_t>& rows, int64_t k,
                          const std::optional<QuantFormat>& quant, Linear* out);
  absl::Status LoadBiases(ModelSource& source,
                          const std::vector<std::string>& names,
                          const std::vector<int64_t>& sizes,
                          std::vector<float>* out);
  void ParallelRows(int64_t n, const std::function<void(int64_t)>& fn) {
    pool_->ParallelFor(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) fn(i);
    });
  }

  const ModelConfig config_;
  const RunnerOptions options_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<Layer> layers_;
  Linear embed_, lm_head_storage_;
  const Linear* lm_head_ = nullptr;
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;
  int64_t weight_bytes_ = 0;
  // Workspaces.
  std::vector<float> x_, xn_, qkv_, attn_, gu_, act_, cos_, sin_;
  // The new tokens' K rows, then their V rows, in the KV dtype.
  std::vector<char> kv_rows_;
  // Runs of rows with consecutive positions of one sequence: stored into the
  // pool together (a whole block at once where the run covers one).
  struct StoreRun {
    int64_t first_row;
    int count;
  };
  std::vector<StoreRun> store_runs_;
  std::vector<Row> rows_;
  std::unique_ptr<AttentionPass> attention_;
};

absl::StatusOr<std::vector<float>> CpuRunner::LoadVector(
    ModelSource& source, const std::string& name, int64_t size) {
  ASSIGN_OR_RETURN(WeightView w, source.Get(name, {size}));
  std::vector<float> v(size);
  ConvertToF32(w.dtype, w.data, size, v.data());
  if (options_.weight_dtype == DType::kBF16) {
    for (float& f : v) f = RoundToBf16(f);
  }
  weight_bytes_ += size * 4;
  return v;
}

absl::Status CpuRunner::LoadMatrix(ModelSource& source,
                                   const std::vector<std::string>& names,
                                   const std::vector<int64_t>& rows, int64_t k,
                                   const std::optional<QuantFormat>& quant,
                                   Linear* out) {
  for (const std::string& name : names) {
    if (source.IsQuantized(name)) {
      return LoadCheckpointQuantized(source, names, rows, k, out);
    }
  }
  int64_t n = 0;
  for (int64_t r : rows) n += r;
  // f32 compute keeps f32 weights holding the quantized values (the
  // reference numerics); bf16 compute runs the quantized kernel.
  out->quantized = quant.has_value() && options_.weight_dtype == DType::kBF16;
  if (out->quantized) {
    out->quant = QuantizedMatrix(n, k, *quant);
  } else {
    out->dense = PackedMatrix(n, k, options_.weight_dtype);
  }
  std::vector<float> row(k), rounded(k);
  int64_t row0 = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(WeightView w, source.Get(names[i], {rows[i], k}));
    if (!quant.has_value()) {
      out->dense.PackRows(row0, w);
    } else {
      const char* src = static_cast<const char*>(w.data);
      const int64_t row_bytes = k * DTypeSize(w.dtype);
      for (int64_t r = 0; r < rows[i]; ++r) {
        ConvertToF32(w.dtype, src + r * row_bytes, k, row.data());
        if (out->quantized) {
          out->quant.QuantizeRow(row0 + r, row.data());
        } else {
          QuantizedMatrix::RoundTrip(*quant, k, row.data(), rounded.data());
          out->dense.SetRow(row0 + r, rounded.data());
        }
      }
    }
    row0 += rows[i];
  }
  weight_bytes_ += out->bytes();
  return absl::OkStatus();
}

absl::Status CpuRunner::LoadCheckpointQuantized(
    ModelSource& source, const std::vector<std::string>& names,
    const std::vector<int64_t>& rows, int64_t k, Linear* out) {
  std::vector<std::optional<QuantizedWeight>> parts(names.size());
  int64_t n = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (source.IsQuantized(names[i])) {
      ASSIGN_OR_RETURN(parts[i], source.GetQuantized(names[i], rows[i], k));
    }
    n += rows[i];
  }
  // The kernel takes the codes as they are when every part is quantized
  // alike: same bits and input groups, each group of one size (a multiple
  // of 32, or the whole row), zero points within a byte. Otherwise (or for
  // f32 compute) the dequantized weights run in --dtype.
  bool kernel = options_.weight_dtype == DType::kBF16;
  const QuantizedWeight* first = parts[0] ? &*parts[0] : nullptr;
  for (const auto& p : parts) {
    kernel = kernel && p.has_value() && first != nullptr &&
             p->bits == first->bits && p->g_idx == first->g_idx &&
             p->groups == first->groups;
  }
  std::vector<int32_t> perm;
  int64_t group = 0;
  if (kernel) {
    const int64_t groups = first->groups;
    std::vector<int64_t> count(groups, 0);
    for (int32_t g : first->g_idx) ++count[g];
    group = groups == 1 ? 0 : count[0];
    for (int64_t c : count) kernel = kernel && (groups == 1 || c == group);
    kernel = kernel && (group == 0 || group % QuantizedMatrix::kBlock == 0);
    perm.resize(k);
    for (int64_t i = 0; i < k; ++i) perm[i] = static_cast<int32_t>(i);
    std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) {
      return first->g_idx[a] < first->g_idx[b];
    });
  }
  bool symmetric = true;
  if (kernel) {
    for (const auto& p : parts) {
      for (int32_t z : p->zeros) {
        kernel = kernel && z >= 0 && z <= 255;
        symmetric = symmetric && z == (1 << (p->bits - 1));
      }
    }
  }
  std::vector<float> row(k);
  if (kernel) {
    bool identity = true;
    for (int64_t i = 0; i < k; ++i) identity = identity && perm[i] == i;
    out->quantized = true;
    out->quant = QuantizedMatrix(
        n, k, QuantFormat{first->bits, static_cast<int>(group), symmetric});
    if (!identity) out->perm = perm;
    std::vector<uint8_t> codes(k), zeros(first->groups);
    std::vector<float> scales(first->groups);
    int64_t row0 = 0;
    for (const auto& p : parts) {
      for (int64_t r = 0; r < p->rows; ++r) {
        for (int64_t i = 0; i < k; ++i) codes[i] = p->codes[r * k + perm[i]];
        for (int64_t g = 0; g < p->groups; ++g) {
          scales[g] = p->scales[g * p->rows + r];
          zeros[g] = static_cast<uint8_t>(p->zeros[g * p->rows + r]);
        }
        out->quant.SetCodes(row0 + r, codes.data(), scales.data(),
                            zeros.data());
        // The f16 scales are stored exactly; anything else is a bug.
        for (int64_t g = 0; g < p->groups; ++g) {
          if (out->quant.Scale(row0 + r, g) != scales[g]) {
            return absl::InvalidArgumentError(absl::StrCat(
                names[0], ": scale ", scales[g], " is not an f16 value"));
          }
        }
      }
      row0 += p->rows;
    }
  } else {
    out->dense = PackedMatrix(n, k, options_.weight_dtype);
    int64_t row0 = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      if (parts[i].has_value()) {
        for (int64_t r = 0; r < rows[i]; ++r) {
          for (int64_t c = 0; c < k; ++c) {
            row[c] = static_cast<float>(parts[i]->Dequantized(r, c));
          }
          out->dense.SetRow(row0 + r, row.data());
        }
      } else {
        ASSIGN_OR_RETURN(WeightView w, source.Get(names[i], {rows[i], k}));
        out->dense.PackRows(row0, w);
      }
      row0 += rows[i];
    }
  }
  weight_bytes_ += out->bytes();
  return absl::OkStatus();
}

absl::Status CpuRunner::LoadBiases(ModelSource& source,
                                   const std::vector<std::string>& names,
                                   const std::vector<int64_t>& sizes,
                                   std::vector<float>* out) {
  out->clear();
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(std::vector<float> b,
                     LoadVector(source, names[i], sizes[i]));
    out->insert(out->end(), b.begin(), b.end());
  }
  return absl::OkStatus();
}

absl::Status CpuRunner::Load(ModelSource& source) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[l];
    const LayerTensors t = DescribeLayerTensors(c, l);
    ASSIGN_OR_RETURN(L.attn_norm, LoadVector(source, t.attn_norm, H));
    ASSIGN_OR_RETURN(L.mlp_norm, LoadVector(source, t.mlp_norm, H));
    const std::optional<QuantFormat>& q = options_.quantization;
    RETURN_IF_ERROR(
        LoadMatrix(source, t.qkv.names, t.qkv.rows, t.qkv.cols, q, &L.qkv));
    RETURN_IF_ERROR(LoadMatrix(source, t.o.names, t.o.rows, t.o.cols, q, &L.o));
    RETURN_IF_ERROR(LoadMatrix(source, t.gate_up.names, t.gate_up.rows,
                               t.gate_up.cols, q, &L.gate_up));
    RETURN_IF_ERROR(
        LoadMatrix(source, t.down.names, t.down.rows, t.down.cols, q, &L.down));
    const std::pair<const std::optional<TensorGroup>*, std::vector<float>*>
        biases[] = {{&t.qkv_bias, &L.qkv_bias},
                    {&t.o_bias, &L.o_bias},
                    {&t.gate_up_bias, &L.gate_up_bias},
                    {&t.down_bias, &L.down_bias}};
    for (const auto& [group, out] : biases) {
      if (group->has_value()) {
        RETURN_IF_ERROR(
            LoadBiases(source, (*group)->names, (*group)->rows, out));
      }
    }
    L.window = c.layer_sliding_window.empty() ? 0 : c.layer_sliding_window[l];
  }
  ASSIGN_OR_RETURN(final_norm_, LoadVector(source, "model.norm.weight", H));
  RETURN_IF_ERROR(LoadMatrix(source, {"model.embed_tokens.weight"},
                             {c.vocab_size}, H, std::nullopt, &embed_));
  // Quantized models keep the lm_head at int8 in groups of 32 whatever the
  // layers' group size (finer logits for 1/16 byte more per weight; int4
  // logits cost accuracy for little speed, as llama.cpp's Q4_0 keeps a wider
  // output tensor); a tied one gets its own copy, the table stays --dtype.
  std::optional<QuantFormat> head_quant;
  if (options_.quantization.has_value()) head_quant = QuantFormat{8, 32, true};
  if (c.tie_word_embeddings && !head_quant.has_value()) {
    lm_head_ = &embed_;
  } else {
    RETURN_IF_ERROR(
        LoadMatrix(source,
                   {c.tie_word_embeddings ? "model.embed_tokens.weight"
                                          : "lm_head.weight"},
                   {c.vocab_size}, H, head_quant, &lm_head_storage_));
    lm_head_ = &lm_head_storage_;
  }
  inv_freq_ = RopeInvFreq(c);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CpuRunner::Create(
    ModelSource& source, const RunnerOptions& options) {
  auto runner =
      std::unique_ptr<CpuRunner>(new CpuRunner(source.config(), options));
  if (options.weight_dtype == DType::kF16) {
    return absl::InvalidArgumentError("compute dtype must be f32 or bf16");
  }
  RETURN_IF_ERROR(runner->Load(source));
  runner->pool_ = std::make_unique<ThreadPool>(options.num_threads);
  const ModelConfig& c = runner->config_;
  const int64_t T = std::max(1, options.max_batch_tokens);
  runner->x_.resize(T * c.hidden_size);
  runner->xn_.resize(T * c.hidden_size);
  runner->qkv_.resize(T * (c.q_dim() + 2 * c.kv_dim()));
  runner->attn_.resize(T * c.q_dim());
  runner->gu_.resize(T * 2 * c.intermediate_size);
  runner->act_.resize(T * c.intermediate_size);
  runner->cos_.resize(T * c.head_dim / 2);
  runner->sin_.resize(T * c.head_dim / 2);
  runner->kv_rows_.resize(T * 2 * c.kv_dim() * 4);
  runner->attention_ = std::make_unique<AttentionPass>(
      c.num_heads, c.num_kv_heads, static_cast<int>(c.head_dim));
  runner->rows_.reserve(T);
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

absl::Status CpuRunner::Forward(
    absl::Span<const RunnerItem> items, KvCache* kv, float* logits,
    const std::function<void(int layer)>& on_layer_done) {
  const ModelConfig& c = config_;
  const int H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int Q = c.q_dim(), KVD = c.kv_dim();
  const int NQKV = Q + 2 * KVD;
  const int half = D / 2;
  const DType kv_dtype = kv->layout().dtype;
  rows_.clear();
  attention_->Clear();
  std::vector<int64_t> last_row(items.size(), -1);
  std::vector<int64_t> first_row(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    first_row[i] = static_cast<int64_t>(rows_.size());
    const std::vector<int32_t>* table = kv->BlockTable(items[i].seq);
    const int64_t n = static_cast<int64_t>(items[i].tokens.size());
    attention_->AddSequence(table, static_cast<int64_t>(rows_.size()),
                            items[i].start_pos, static_cast<int>(n));
    for (int64_t t = 0; t < n; ++t) {
      rows_.push_back({table, items[i].tokens[t],
                       items[i].start_pos + static_cast<int>(t)});
    }
    last_row[i] = static_cast<int64_t>(rows_.size()) - 1;
  }
  const int64_t T = static_cast<int64_t>(rows_.size());
  if (T > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", T, " tokens exceeds max_batch_tokens ",
                     options_.max_batch_tokens));
  }
  attention_->Plan(pool_->num_threads());
  // One run per (sequence, block) the new tokens fall in, so the threads
  // split the stores by block.
  store_runs_.clear();
  const int block_size = kv->layout().block_size;
  for (int64_t r = 0; r < T; ++r) {
    if (!store_runs_.empty()) {
      StoreRun& run = store_runs_.back();
      const Row& prev = rows_[r - 1];
      if (rows_[r].table == prev.table && rows_[r].pos == prev.pos + 1 &&
          rows_[r].pos % block_size != 0) {
        ++run.count;
        continue;
      }
    }
    store_runs_.push_back({r, 1});
  }
  float* x = x_.data();
  float* xn = xn_.data();
  float* qkv = qkv_.data();
  ParallelRows(T, [&](int64_t r) {
    embed_.dense.GetRow(rows_[r].token, x + r * H);
    RopeAngles(inv_freq_, rows_[r].pos, cos_.data() + r * half,
               sin_.data() + r * half);
  });
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    ParallelRows(T, [&](int64_t r) {
      RmsNorm(x + r * H, L.attn_norm.data(), H, eps, xn + r * H);
    });
    LinearMatMul(*pool_, xn, T, H, L.qkv,
                 L.qkv_bias.empty() ? nullptr : L.qkv_bias.data(), qkv, NQKV);
    // RoPE on q and k, then K and V of every new token into the cache.
    ParallelRows(T, [&](int64_t r) {
      float* row = qkv + r * NQKV;
      const float* cs = cos_.data() + r * half;
      const float* sn = sin_.data() + r * half;
      ApplyRope(row, c.num_heads, D, cs, sn);
      ApplyRope(row + Q, c.num_kv_heads, D, cs, sn);
      for (int which = 0; which < 2; ++which) {
        char* stored = kv_rows_.data() + (which * T + r) * kv->row_bytes();
        StoreRow(row + Q + which * KVD, KVD, kv_dtype, stored);
      }
    });
    ParallelRows(static_cast<int64_t>(store_runs_.size()), [&](int64_t i) {
      const StoreRun& run = store_runs_[i];
      const Row& first = rows_[run.first_row];
      for (int which = 0; which < 2; ++which) {
        kv->WriteRowsAt(
            *first.table, l, which, first.pos, run.count,
            kv_rows_.data() + (which * T + run.first_row) * kv->row_bytes());
      }
    });
    if (on_layer_done) on_layer_done(l);
    attention_->Run(*pool_, *kv, l, L.window, qkv, NQKV, attn_.data(), Q);
    LinearMatMul(*pool_, attn_.data(), T, Q, L.o,
                 L.o_bias.empty() ? nullptr : L.o_bias.data(), xn, H);
    ParallelRows(T, [&](int64_t r) {
      float* xr = x + r * H;
      float* xnr = xn + r * H;
      for (int i = 0; i < H; ++i) xr[i] = xr[i] + xnr[i];
      RmsNorm(xr, L.mlp_norm.data(), H, eps, xnr);
    });
    LinearMatMul(*pool_, xn, T, H, L.gate_up,
                 L.gate_up_bias.empty() ? nullptr : L.gate_up_bias.data(),
                 gu_.data(), 2 * I);
    ParallelRows(T, [&](int64_t r) {
      const float* g = gu_.data() + r * 2 * I;
      SiluMul(g, g + I, I, act_.data() + r * I);
    });
    LinearMatMul(*pool_, act_.data(), T, I, L.down,
                 L.down_bias.empty() ? nullptr : L.down_bias.data(), xn, H);
    ParallelRows(T, [&](int64_t r) {
      float* xr = x + r * H;
      const float* d = xn + r * H;
      for (int i = 0; i < H; ++i) xr[i] = xr[i] + d[i];
    });
  }
  // Every row of the items that want all their logits (each row alone
  // through the same norm and lm_head: the bits of a last row).
  const int64_t V = c.vocab_size;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].token_logits == nullptr || last_row[i] < first_row[i]) {
      continue;
    }
    const int64_t n = last_row[i] - first_row[i] + 1;
    ParallelRows(n, [&](int64_t j) {
      RmsNorm(x + (first_row[i] + j) * H, final_norm_.data(), H, eps,
              xn + j * H);
    });
    LinearMatMul(*pool_, xn, n, H, *lm_head_, nullptr, items[i].token_logits,
                 V);
  }
  // Final norm and lm_head only for the rows whose logits are wanted.
  std::vector<size_t> wanted;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].want_logits && last_row[i] >= 0) wanted.push_back(i);
  }
  if (wanted.empty()) return absl::OkStatus();
  ParallelRows(static_cast<int64_t>(wanted.size()), [&](int64_t j) {
    RmsNorm(x + last_row[wanted[j]] * H, final_norm_.data(), H, eps,
            xn + j * H);
  });
  if (wanted.size() == items.size()) {
    LinearMatMul(*pool_, xn, static_cast<int64_t>(wanted.size()), H, *lm_head_,
                 nullptr, logits, V);
  } else {
    std::vector<float> compact(wanted.size() * V);
    LinearMatMul(*pool_, xn, static_cast<int64_t>(wanted.size()), H, *lm_head_,
                 nullptr, compact.data(), V);
    for (size_t j = 0; j < wanted.size(); ++j) {
      std::memcpy(logits + wanted[j] * V, compact.data() + j * V,
                  V * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuRunner(
    ModelSource& source, const RunnerOptions& options) {
  return CpuRunner::Create(source, options);
}

}  // namespace pdserve
