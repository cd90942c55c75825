#include "common/kv/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pdserve {

int64_t KvLayout::BytesPerTokenPerLayer() const {
  return int64_t{2} * num_kv_heads * head_dim * DTypeSize(dtype);
}

int64_t KvLayout::BytesPerBlock() const {
  return BytesPerTokenPerLayer() * block_size * num_layers;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvLayout& layout,
                                                         int64_t budget_bytes) {
  if (layout.block_size <= 0 || layout.num_layers <= 0 ||
      layout.num_kv_heads <= 0 || layout.head_dim <= 0) {
    return absl::InvalidArgumentError("invalid KV layout");
  }
  if (layout.dtype == DType::kF16) {
    return absl::InvalidArgumentError("KV dtype must be f32 or bf16");
  }
  const int64_t num_blocks = budget_bytes / layout.BytesPerBlock();
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache budget of ", budget_bytes,
                     " bytes holds no block (one block of ", layout.block_size,
                     " tokens needs ", layout.BytesPerBlock(), " bytes)"));
  }
  if (num_blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("KV cache budget too large");
  }
  const int64_t bytes = num_blocks * layout.BytesPerBlock();
  // Anonymous mapping: pages become resident only when first written, and
  // the pool never grows past `bytes`.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map a KV cache of ", bytes, " bytes"));
  }
  return std::unique_ptr<KvCache>(
      new KvCache(layout, num_blocks, static_cast<char*>(base), bytes));
}

KvCache::KvCache(const KvLayout& layout, int64_t num_blocks, char* base,
                 int64_t mapped_bytes)
    : layout_(layout),
      num_blocks_(num_blocks),
      base_(base),
      mapped_bytes_(mapped_bytes),
      row_bytes_(int64_t{layout.num_kv_heads} * layout.head_dim *
                 DTypeSize(layout.dtype)) {
  free_list_.reserve(num_blocks);
  // Pop from the back: lowest block ids are handed out first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) {
    free_list_.push_back(static_cast<int32_t>(b));
  }
}

KvCache::~KvCache() { munmap(base_, mapped_bytes_); }

int64_t KvCache::BlocksFor(int64_t tokens) const {
  return (tokens + layout_.block_size - 1) / layout_.block_size;
}

SeqId KvCache::CreateSequence() {
  const SeqId id = next_seq_++;
  seqs_.emplace(id, Sequence());
  return id;
}

absl::Status KvCache::Reserve(SeqId seq, int total_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  }
  std::vector<int32_t>& blocks = it->second.blocks;
  const int64_t need = BlocksFor(total_tokens);
  const int64_t extra = need - static_cast<int64_t>(blocks.size());
  if (extra <= 0) return absl::OkStatus();
  if (extra > free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: sequence needs ", extra,
                     " more blocks for ", total_tokens, " tokens, ",
                     free_blocks(), " of ", num_blocks_, " free"));
  }
  for (int64_t i = 0; i < extra; ++i) {
    blocks.push_back(free_list_.back());
    free_list_.pop_back();
  }
  return absl::OkStatus();
}

int KvCache::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? -1 : it->second.length;
}

int KvCache::Capacity(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end()
             ? -1
             : static_cast<int>(it->second.blocks.size()) * layout_.block_size;
}

absl::Status KvCache::SetLength(SeqId seq, int length) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  }
  const int capacity =
      static_cast<int>(it->second.blocks.size()) * layout_.block_size;
  if (length < 0 || length > capacity) {
    return absl::OutOfRangeError(absl::StrCat(
        "sequence length ", length, " outside [0, capacity ", capacity, "]"));
  }
  it->second.length = length;
  return absl::OkStatus();
}

void KvCache::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int32_t b : it->second.blocks) free_list_.push_back(b);
  seqs_.erase(it);
}

const std::vector<int32_t>* KvCache::BlockTable(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second.blocks;
}

char* KvCache::Row(const std::vector<int32_t>& table, int layer, int pos,
                   int kv) const {
  // Memory: [block][layer][K|V][block_size][kv_heads * head_dim].
  return BlockRow(table[pos / layout_.block_size], layer, kv,
                  pos % layout_.block_size);
}

char* KvCache::KeyRowAt(const std::vector<int32_t>& table, int layer,
                        int pos) const {
  return Row(table, layer, pos, 0);
}
char* KvCache::ValueRowAt(const std::vector<int32_t>& table, int layer,
                          int pos) const {
  return Row(table, layer, pos, 1);
}
char* KvCache::KeyRow(SeqId seq, int layer, int pos) {
  return Row(*BlockTable(seq), layer, pos, 0);
}
char* KvCache::ValueRow(SeqId seq, int layer, int pos) {
  return Row(*BlockTable(seq), layer, pos, 1);
}
const char* KvCache::KeyRow(SeqId seq, int layer, int pos) const {
  return Row(*BlockTable(seq), layer, pos, 0);
}
const char* KvCache::ValueRow(SeqId seq, int layer, int pos) const {
  return Row(*BlockTable(seq), layer, pos, 1);
}

absl::Status KvCache::ExportLayer(SeqId seq, int layer, int begin, int end,
                                  std::string* out) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  }
  if (layer < 0 || layer >= layout_.num_layers) {
    return absl::OutOfRangeError(
        absl::StrCat("layer ", layer, " out of range"));
  }
  if (begin < 0 || end < begin || end > it->second.length) {
    return absl::OutOfRangeError(absl::StrCat("export range [", begin, ", ",
                                              end, ") outside the sequence's ",
                                              it->second.length, " tokens"));
  }
  const int64_t n = end - begin;
  out->resize(2 * n * row_bytes_);
  char* dst = out->data();
  for (int kv = 0; kv < 2; ++kv) {
    for (int pos = begin; pos < end; ++pos) {
      std::memcpy(dst, Row(it->second.blocks, layer, pos, kv), row_bytes_);
      dst += row_bytes_;
    }
  }
  return absl::OkStatus();
}

absl::Status KvCache::ImportLayer(SeqId seq, int layer, int begin, int end,
                                  absl::string_view bytes) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  }
  if (layer < 0 || layer >= layout_.num_layers) {
    return absl::OutOfRangeError(
        absl::StrCat("layer ", layer, " out of range"));
  }
  const int capacity =
      static_cast<int>(it->second.blocks.size()) * layout_.block_size;
  if (begin < 0 || end < begin || end > capacity) {
    return absl::OutOfRangeError(
        absl::StrCat("import range [", begin, ", ", end,
                     ") outside the sequence's capacity ", capacity));
  }
  const int64_t n = end - begin;
  if (static_cast<int64_t>(bytes.size()) != 2 * n * row_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV import of ", n, " tokens expects ", 2 * n * row_bytes_,
                     " bytes, got ", bytes.size()));
  }
  const char* src = bytes.data();
  for (int kv = 0; kv < 2; ++kv) {
    for (int pos = begin; pos < end; ++pos) {
      std::memcpy(Row(it->second.blocks, layer, pos, kv), src, row_bytes_);
      src += row_bytes_;
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve
