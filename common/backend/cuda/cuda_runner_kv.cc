// The CUDA runner's device mirror of the KV pool: same block ids as the
// host KvCache, its own per-block layout ([layer][K|V][block_size] token
// rows, as the CUDA kernels read it; the host pool's tiles are the CPU
// kernels'); exports and imports stage the wire layout (token-major)
// through pinned host memory on the copy stream.
// NOT YET RUN ON A GPU.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_runner.h"
#include "common/util/checksum.h"
#include "common/util/status_macros.h"

namespace pdserve {
namespace cuda {

absl::Status CudaRunner::AttachKvPool(const KvCache& kv) {
  const KvLayout& layout = kv.layout();
  if (layout.num_layers != config_.num_layers ||
      layout.num_kv_heads != config_.num_kv_heads ||
      layout.head_dim != config_.head_dim) {
    return absl::InvalidArgumentError("KV layout does not match the model");
  }
  const int64_t bytes = kv.total_blocks() * layout.BytesPerBlock();
  ASSIGN_OR_RETURN(pool_, cuda::DeviceAlloc(bytes, "KV pool"));
  RETURN_IF_ERROR(CudaStatus(cudaMemset(pool_.get(), 0, bytes), "memset"));
  pool_view_.base = pool_.get();
  pool_view_.num_layers = layout.num_layers;
  pool_view_.block_size = layout.block_size;
  pool_view_.num_kv_heads = layout.num_kv_heads;
  pool_view_.head_dim = layout.head_dim;
  pool_view_.bf16 = layout.dtype == DType::kBF16;
  row_bytes_ = kv.row_bytes();
  return absl::OkStatus();
}

absl::Status CudaRunner::CheckRange(const KvCache& kv, SeqId seq, int layer,
                                    int begin, int end, int limit) const {
  if (layer < 0 || layer >= config_.num_layers) {
    return absl::OutOfRangeError(
        absl::StrCat("layer ", layer, " out of range"));
  }
  if (begin < 0 || end < begin || end > limit) {
    return absl::OutOfRangeError(absl::StrCat("KV range [", begin, ", ", end,
                                              ") outside the sequence's ",
                                              limit, " tokens"));
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::CopyRows(const std::vector<int32_t>& table, int layer,
                                  int begin, int end, bool to_device) {
  const int bs = pool_view_.block_size;
  const int64_t n = end - begin;
  char* stage = static_cast<char*>(staging_.get());
  char* base = static_cast<char*>(pool_.get());
  for (int kvi = 0; kvi < 2; ++kvi) {
    for (int pos = begin; pos < end;) {
      const int b = pos / bs;
      const int run = std::min(end, (b + 1) * bs) - pos;
      const int64_t row =
          ((int64_t{table[b]} * pool_view_.num_layers + layer) * 2 + kvi) * bs +
          pos % bs;
      char* dev = base + row * row_bytes_;
      char* st = stage + (kvi * n + (pos - begin)) * row_bytes_;
      RETURN_IF_ERROR(
          CudaStatus(to_device ? cudaMemcpyAsync(dev, st, run * row_bytes_,
                                                 cudaMemcpyHostToDevice, copy_)
                               : cudaMemcpyAsync(st, dev, run * row_bytes_,
                                                 cudaMemcpyDeviceToHost, copy_),
                     "KV copy"));
      pos += run;
    }
  }
  return CudaStatus(cudaStreamSynchronize(copy_), "KV copy");
}

absl::Status CudaRunner::ExportLayerKv(const KvCache& kv, SeqId seq, int layer,
                                       int begin, int end, absl::Span<char> out,
                                       uint64_t* xxh3, Stores) {
  const std::vector<int32_t>* table = kv.BlockTable(seq);
  if (table == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  }
  RETURN_IF_ERROR(CheckRange(kv, seq, layer, begin, end, kv.Length(seq)));
  const int64_t bytes = 2 * int64_t{end - begin} * row_bytes_;
  if (static_cast<int64_t>(out.size()) != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV export of ", end - begin, " tokens needs ", bytes,
                     " bytes, got a buffer of ", out.size()));
  }
  RETURN_IF_ERROR(EnsureStaging(bytes));
  // Called from on_layer_done (the layer's event has completed) or between
  // passes (the compute stream is idle): the rows are final.
  RETURN_IF_ERROR(CopyRows(*table, layer, begin, end, /*to_device=*/false));
  if (xxh3 != nullptr) {
    *xxh3 = CopyWithXxh3(out.data(), staging_.get(), bytes);
  } else {
    std::memcpy(out.data(), staging_.get(), bytes);
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::ImportLayerKv(KvCache& kv, SeqId seq, int layer,
                                       int begin, int end,
                                       absl::string_view bytes,
                                       uint64_t* xxh3) {
  // The host pool validates (range, size, immutable prefix blocks) and keeps
  // a host copy; the device mirror then receives the same rows.
  RETURN_IF_ERROR(kv.ImportLayer(seq, layer, begin, end, bytes, xxh3));
  const std::vector<int32_t>* table = kv.BlockTable(seq);
  RETURN_IF_ERROR(EnsureStaging(bytes.size()));
  std::memcpy(staging_.get(), bytes.data(), bytes.size());
  return CopyRows(*table, layer, begin, end, /*to_device=*/true);
}

}  // namespace cuda
}  // namespace pdserve
