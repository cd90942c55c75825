#include "common/kv/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_tile_copy.h"
#include "common/util/huge_pages.h"

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
  // Anonymous mapping on huge pages (attention streams it). A first
  // request touches the start of every layer's and head's region, i.e. a
  // 2 MiB page each, which is most of a default-sized pool: on huge pages
  // the pool is made resident here instead of during the first requests
  // (whose prefill it slowed, by zeroing hundreds of MiB). With
  // PDSERVE_HUGE_PAGES=0, or a kernel without huge pages, pages become
  // resident when first written. Either way the pool never grows past
  // `bytes`.
  char* const base = static_cast<char*>(MapForStreaming(bytes));
  if (base == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map a KV cache of ", bytes, " bytes"));
  }
  if (HugePagesWanted() && KernelHasHugePages()) Prefault(base, bytes);
  return std::unique_ptr<KvCache>(new KvCache(layout, num_blocks, base, bytes));
}

KvCache::KvCache(const KvLayout& layout, int64_t num_blocks, char* base,
                 int64_t mapped_bytes)
    : layout_(layout),
      num_blocks_(num_blocks),
      base_(base),
      mapped_bytes_(mapped_bytes),
      row_bytes_(int64_t{layout.num_kv_heads} * layout.head_dim *
                 DTypeSize(layout.dtype)),
      tile_bytes_(int64_t{layout.block_size} * layout.head_dim *
                  DTypeSize(layout.dtype)) {
  info_.resize(num_blocks);
  free_list_.reserve(num_blocks);
  // Pop from the back: lowest block ids are handed out first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) {
    free_list_.push_back(static_cast<int32_t>(b));
  }
}

KvCache::~KvCache() { munmap(base_, mapped_bytes_); }

absl::Status CheckRequestFitsPool(int64_t tokens, int block_size,
                                  int64_t total_blocks,
                                  absl::string_view pool) {
  const int64_t needed = (tokens + block_size - 1) / block_size;
  if (needed <= total_blocks) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(
      "request needs ", needed, " KV blocks (", tokens, " tokens), ", pool,
      " whole KV pool has ", total_blocks, " (", total_blocks * block_size,
      " tokens): lower max_tokens or the prompt, or give the worker more "
      "--kv_cache_memory"));
}

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
  for (int64_t i = 0; i < extra; ++i) blocks.push_back(AllocateBlock());
  return absl::OkStatus();
}

int32_t KvCache::AllocateBlock() {
  int32_t block;
  if (!free_list_.empty()) {
    block = free_list_.back();
    free_list_.pop_back();
  } else {
    block = lru_.front();
    lru_.pop_front();
    Unregister(block);
    ++stats_.evictions;
  }
  info_[block].refs = 1;
  return block;
}

void KvCache::Unregister(int32_t block) {
  BlockInfo& b = info_[block];
  if (!b.hashed) return;
  auto it = cached_.find(b.hash);
  if (it != cached_.end() && it->second == block) cached_.erase(it);
  b.hashed = false;
}

void KvCache::ReleaseBlock(int32_t block) {
  BlockInfo& b = info_[block];
  if (--b.refs > 0) return;
  if (b.hashed) {
    b.lru_pos = lru_.insert(lru_.end(), block);
  } else {
    free_list_.push_back(block);
  }
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
  Sequence& s = it->second;
  // Registered blocks that are no longer entirely below `length` would be
  // rewritten: refuse for shared ones, unregister the sequence's own.
  const size_t keep_blocks = static_cast<size_t>(length / layout_.block_size);
  for (size_t k = keep_blocks; k < s.hashes.size(); ++k) {
    if (info_[s.blocks[k]].refs > 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence length ", length,
                       " would rewrite shared cached block ", k));
    }
  }
  for (size_t k = keep_blocks; k < s.hashes.size(); ++k) {
    Unregister(s.blocks[k]);
  }
  if (s.hashes.size() > keep_blocks) s.hashes.resize(keep_blocks);
  if (static_cast<int>(s.tokens.size()) > length) s.tokens.resize(length);
  s.length = length;
  return absl::OkStatus();
}

void KvCache::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Last block first: a chain's tail is evicted before its head.
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) ReleaseBlock(*b);
  seqs_.erase(it);
}

void KvCache::EnablePrefixCache(const BlockHash& root) {
  prefix_enabled_ = true;
  prefix_root_ = root;
}

absl::StatusOr<int> KvCache::AttachPrefix(SeqId seq,
                                          absl::Span<const int32_t> tokens,
                                          int max_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  }
  Sequence& s = it->second;
  if (!s.blocks.empty() || s.length != 0) {
    return absl::FailedPreconditionError(
        "a cached prefix attaches only to an empty sequence");
  }
  if (!prefix_enabled_) return 0;
  max_tokens = std::min<int>(max_tokens, static_cast<int>(tokens.size()));
  ++stats_.queries;
  stats_.query_tokens += tokens.size();
  const int bs = layout_.block_size;
  BlockHash h = prefix_root_;
  for (int k = 0; (k + 1) * bs <= max_tokens; ++k) {
    h = ChainBlockHash(h, tokens.subspan(k * bs, bs));
    auto found = cached_.find(h);
    if (found == cached_.end()) break;
    const int32_t block = found->second;
    BlockInfo& b = info_[block];
    if (b.refs == 0) lru_.erase(b.lru_pos);
    ++b.refs;
    s.blocks.push_back(block);
    s.hashes.push_back(h);
  }
  s.length = static_cast<int>(s.blocks.size()) * bs;
  s.tokens.assign(tokens.begin(), tokens.begin() + s.length);
  s.tracked = true;
  stats_.hit_tokens += s.length;
  return s.length;
}

absl::Status KvCache::RecordTokens(SeqId seq, int start,
                                   absl::Span<const int32_t> tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  }
  Sequence& s = it->second;
  if (!prefix_enabled_ || !s.tracked) return absl::OkStatus();
  if (start < 0 || start > static_cast<int>(s.tokens.size())) {
    s.tracked = false;  // a gap: the tokens of some positions are unknown
    return absl::OkStatus();
  }
  if (start < static_cast<int>(s.hashes.size()) * layout_.block_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("tokens at ", start, " would rewrite a registered block"));
  }
  s.tokens.resize(start);
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  RegisterFullBlocks(s);
  return absl::OkStatus();
}

void KvCache::RegisterFullBlocks(Sequence& s) {
  const int bs = layout_.block_size;
  const int covered = std::min<int>(s.length, s.tokens.size());
  while (static_cast<int>(s.hashes.size() + 1) * bs <= covered) {
    const size_t k = s.hashes.size();
    const BlockHash h =
        ChainBlockHash(k == 0 ? prefix_root_ : s.hashes.back(),
                       absl::MakeConstSpan(s.tokens).subspan(k * bs, bs));
    s.hashes.push_back(h);
    BlockInfo& b = info_[s.blocks[k]];
    if (b.hashed) continue;  // attached from the cache: same content
    // Another block may already hold this content (computed concurrently):
    // keep the first, this one stays private and is freed normally.
    if (cached_.emplace(h, s.blocks[k]).second) {
      b.hashed = true;
      b.hash = h;
    }
  }
}

PrefixCacheStats KvCache::prefix_stats() const {
  PrefixCacheStats st = stats_;
  st.cached_blocks = static_cast<int64_t>(cached_.size());
  st.evictable_blocks = static_cast<int64_t>(lru_.size());
  return st;
}

const std::vector<int32_t>* KvCache::BlockTable(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second.blocks;
}

kv_internal::TileGeometry KvCache::Geometry() const {
  return kv_internal::TileGeometry{
      tile_bytes_,          num_blocks_ * 2 * tile_bytes_,
      layout_.num_kv_heads, layout_.head_dim,
      layout_.block_size,   static_cast<int>(DTypeSize(layout_.dtype))};
}

void KvCache::WriteBlockRow(int32_t block, int layer, int kv, int offset,
                            const char* row) {
  kv_internal::RowsToTiles(Geometry(), kv == 0, offset, offset + 1, row,
                           Tile(block, layer, kv, 0));
}

void KvCache::ReadBlockRow(int32_t block, int layer, int kv, int offset,
                           char* row) const {
  kv_internal::TilesToRows(Geometry(), kv == 0, Tile(block, layer, kv, 0),
                           offset, offset + 1, row);
}

void KvCache::WriteRowAt(const std::vector<int32_t>& table, int layer, int kv,
                         int pos, const char* row) {
  WriteBlockRow(table[pos / layout_.block_size], layer, kv,
                pos % layout_.block_size, row);
}

void KvCache::WriteRowsAt(const std::vector<int32_t>& table, int layer, int kv,
                          int pos, int n, const char* rows, Xxh3Stream* hash,
                          Stores stores) {
  const kv_internal::TileGeometry g = Geometry();
  const int bs = layout_.block_size;
  for (const int end = pos + n; pos < end;) {
    const int offset = pos % bs;
    const int count = std::min(end - pos, bs - offset);
    kv_internal::RowsToTiles(g, kv == 0, offset, offset + count, rows,
                             Tile(table[pos / bs], layer, kv, 0), stores);
    if (hash != nullptr) hash->Update(rows, count * row_bytes_);
    rows += count * row_bytes_;
    pos += count;
  }
  if (stores == Stores::kStreaming) StreamingFence();
}

void KvCache::ReadRowAt(const std::vector<int32_t>& table, int layer, int kv,
                        int pos, char* row) const {
  ReadBlockRow(table[pos / layout_.block_size], layer, kv,
               pos % layout_.block_size, row);
}

absl::Status KvCache::ExportLayer(SeqId seq, int layer, int begin, int end,
                                  std::string* out, uint64_t* xxh3) const {
  out->resize(end > begin ? 2 * int64_t{end - begin} * row_bytes_ : 0);
  return ExportLayer(seq, layer, begin, end, absl::MakeSpan(*out), xxh3);
}

absl::Status KvCache::ExportLayer(SeqId seq, int layer, int begin, int end,
                                  absl::Span<char> out, uint64_t* xxh3,
                                  Stores stores) const {
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
  if (static_cast<int64_t>(out.size()) != 2 * n * row_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV export of ", n, " tokens needs ", 2 * n * row_bytes_,
                     " bytes, got a buffer of ", out.size()));
  }
  char* dst = out.data();
  const kv_internal::TileGeometry g = Geometry();
  const std::vector<int32_t>& table = it->second.blocks;
  const int bs = layout_.block_size;
  // Streaming: a block's rows are written to a staging buffer that stays
  // in cache, hashed there and streamed on.
  const bool streaming = stores == Stores::kStreaming;
  thread_local std::vector<char> staging;
  if (streaming) {
    staging.resize(static_cast<size_t>(bs * row_bytes_ + 64));
  }
  char* const stage =
      streaming ? reinterpret_cast<char*>(
                      (reinterpret_cast<uintptr_t>(staging.data()) + 63) &
                      ~uintptr_t{63})
                : nullptr;
  Xxh3Stream hash;
  for (int kv = 0; kv < 2; ++kv) {
    // Block by block: one block's tiles stay in cache while its rows are
    // written.
    for (int pos = begin; pos < end;) {
      const int offset = pos % bs;
      const int count = std::min(end - pos, bs - offset);
      const int64_t n = count * row_bytes_;
      char* rows = streaming ? stage : dst;
      kv_internal::TilesToRows(g, kv == 0, Tile(table[pos / bs], layer, kv, 0),
                               offset, offset + count, rows);
      if (xxh3 != nullptr) hash.Update(rows, n);
      if (streaming) StreamingCopyUnfenced(dst, rows, static_cast<size_t>(n));
      dst += n;
      pos += count;
    }
  }
  if (streaming) StreamingFence();
  if (xxh3 != nullptr) *xxh3 = hash.Digest();
  return absl::OkStatus();
}

Stores KvCache::ImportStores(int64_t bytes) {
  static const int forced = [] {
    const char* v = std::getenv("PDSERVE_KV_STREAMING_IMPORT");
    return v == nullptr ? -1 : std::atoi(v);
  }();
  const bool stream =
      forced >= 0 ? forced != 0 : bytes >= kStreamingImportMinBytes;
  return stream ? Stores::kStreaming : Stores::kCached;
}

absl::Status KvCache::ImportLayer(SeqId seq, int layer, int begin, int end,
                                  absl::string_view bytes, uint64_t* xxh3) {
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
  for (int k = begin / layout_.block_size;
       n > 0 && k <= (end - 1) / layout_.block_size; ++k) {
    if (info_[it->second.blocks[k]].hashed) {
      return absl::FailedPreconditionError(
          absl::StrCat("import range [", begin, ", ", end,
                       ") touches a registered prefix block (immutable)"));
    }
  }
  if (static_cast<int64_t>(bytes.size()) != 2 * n * row_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV import of ", n, " tokens expects ", 2 * n * row_bytes_,
                     " bytes, got ", bytes.size()));
  }
  const Stores stores = ImportStores(bytes.size());
  Xxh3Stream hash;
  for (int kv = 0; kv < 2; ++kv) {
    WriteRowsAt(it->second.blocks, layer, kv, begin, static_cast<int>(n),
                bytes.data() + kv * n * row_bytes_,
                xxh3 != nullptr ? &hash : nullptr, stores);
  }
  if (xxh3 != nullptr) *xxh3 = hash.Digest();
  return absl::OkStatus();
}

}  // namespace pdserve
