// The Hugging Face BPE model: vocabulary, ranked merges, byte_fallback,
// unk/fuse_unk, continuing_subword_prefix/end_of_word_suffix, ignore_merges,
// and a per-word merge cache. Immutable after FromJson except the cache,
// which is sharded and mutex-protected: Tokenize is thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_BPE_MODEL_H_
#define PDSERVE_COMMON_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json_fwd.hpp"

namespace pdserve::tok {

// Bounded word -> ids cache split into shards with one mutex each, so
// concurrent encoders rarely contend. Thread-safe. Stops inserting when a
// shard is full (like HF's cache), so memory stays bounded.
class WordCache {
 public:
  bool Lookup(std::string_view word, std::vector<int32_t>* out) const;
  void Insert(std::string_view word, const int32_t* ids, size_t n);

 private:
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxEntriesPerShard = 4096;
  struct Shard {
    mutable absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> map
        ABSL_GUARDED_BY(mu);
  };
  std::array<Shard, kShards> shards_;
};

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object (type BPE or absent).
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(
      const nlohmann::json& model, bool use_cache);

  // Appends the ids of one pre-token (non-empty, valid UTF-8).
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token string of `id`, or null when the vocabulary has no such id.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id in the vocabulary.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
           static_cast<uint32_t>(b);
  }
  void MergeWord(std::string_view word, std::vector<int32_t>* ids) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // "<0xNN>" ids, -1 when absent
  std::optional<int32_t> unk_id_;
  std::optional<std::string> prefix_;  // continuing_subword_prefix
  std::optional<std::string> suffix_;  // end_of_word_suffix
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  bool use_cache_ = true;
  mutable WordCache cache_;
};

}  // namespace pdserve::tok

#endif  // PDSERVE_COMMON_TOKENIZER_BPE_MODEL_H_
