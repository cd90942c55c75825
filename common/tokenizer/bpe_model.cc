#include "common/tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/unicode.h"

namespace pdserve::tok {
namespace {

// HF does not cache words this long.
constexpr size_t kMaxCachedWordBytes = 256;

absl::string_view AbslView(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

size_t ShardOf(std::string_view word, size_t shards) {
  return absl::Hash<absl::string_view>()(AbslView(word)) % shards;
}

// One symbol of a word being merged (a doubly linked list in a vector).
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  int32_t len;  // 0 once merged into its left neighbour
};
struct QueuedMerge {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // Min-heap on (rank, pos) through std::push_heap's max-heap.
  bool operator<(const QueuedMerge& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

}  // namespace

bool WordCache::Lookup(std::string_view word, std::vector<int32_t>* out) const {
  const Shard& shard = shards_[ShardOf(word, kShards)];
  absl::MutexLock lock(&shard.mu);
  auto it = shard.map.find(AbslView(word));
  if (it == shard.map.end()) return false;
  out->insert(out->end(), it->second.begin(), it->second.end());
  return true;
}

void WordCache::Insert(std::string_view word, const int32_t* ids, size_t n) {
  Shard& shard = shards_[ShardOf(word, kShards)];
  absl::MutexLock lock(&shard.mu);
  if (shard.map.size() >= kMaxEntriesPerShard) return;
  shard.map.try_emplace(std::string(word), ids, ids + n);
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(
    const nlohmann::json& model, bool use_cache) {
  const std::string type = JsonType(model);
  if (!type.empty() && type != "BPE") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported model type \"", type, "\" (only BPE is implemented)"));
  }
  if (!model.contains("vocab") || !model.contains("merges")) {
    return absl::InvalidArgumentError(
        "model has no \"vocab\"/\"merges\" (only BPE is implemented)");
  }
  auto bpe = std::make_unique<BpeModel>();
  bpe->use_cache_ = use_cache;
  const auto& vocab = model.at("vocab");
  if (!vocab.is_object()) {
    return absl::InvalidArgumentError("model.vocab must be an object");
  }
  int64_t max_id = -1;
  bpe->vocab_.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id > (1 << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab id ", id, " of \"", token, "\" out of range"));
    }
    bpe->vocab_[token] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  }
  bpe->id_to_token_.resize(max_id + 1);
  bpe->has_id_.resize(max_id + 1);
  for (const auto& [token, id] : bpe->vocab_) {
    bpe->id_to_token_[id] = token;
    bpe->has_id_[id] = true;
  }

  bpe->byte_fallback_ = JsonOr(model, "byte_fallback", false);
  bpe->fuse_unk_ = JsonOr(model, "fuse_unk", false);
  bpe->ignore_merges_ = JsonOr(model, "ignore_merges", false);
  if (model.contains("continuing_subword_prefix") &&
      !model.at("continuing_subword_prefix").is_null()) {
    bpe->prefix_ = model.at("continuing_subword_prefix").get<std::string>();
  }
  if (model.contains("end_of_word_suffix") &&
      !model.at("end_of_word_suffix").is_null()) {
    bpe->suffix_ = model.at("end_of_word_suffix").get<std::string>();
  }
  if (model.contains("unk_token") && !model.at("unk_token").is_null()) {
    const std::string unk = model.at("unk_token").get<std::string>();
    auto id = bpe->TokenToId(unk);
    if (!id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unk_token \"", unk, "\" is not in the vocabulary"));
    }
    bpe->unk_id_ = *id;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    bpe->byte_ids_[b] = bpe->TokenToId(name).value_or(-1);
  }

  const size_t prefix_len = bpe->prefix_ ? bpe->prefix_->size() : 0;
  const auto& merges = model.at("merges");
  if (!merges.is_array()) {
    return absl::InvalidArgumentError("model.merges must be an array");
  }
  bpe->merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const auto& m : merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos ||
          s.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("merges entry ", rank + 1, " (\"", s,
                         "\") is not two tokens separated by one space"));
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("merges entry ", rank + 1, " is malformed"));
    }
    auto a_id = bpe->TokenToId(a);
    auto b_id = bpe->TokenToId(b);
    if (b.size() < prefix_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge token \"", b, "\" is shorter than the prefix"));
    }
    std::string merged = a + b.substr(prefix_len);
    auto new_id = bpe->TokenToId(merged);
    for (const auto& [tok, id] : {std::pair{&a, a_id}, std::pair{&b, b_id},
                                  std::pair{&merged, new_id}}) {
      if (!id.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("merges entry ", rank + 1, ": token \"", *tok,
                         "\" is not in the vocabulary"));
      }
    }
    // Like HF, a repeated pair keeps the later rank.
    bpe->merges_[PairKey(*a_id, *b_id)] = Merge{rank, *new_id};
    ++rank;
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(AbslView(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view word,
                        std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = TokenToId(word)) {
      ids->push_back(*id);
      return;
    }
  }
  const bool cacheable = use_cache_ && word.size() < kMaxCachedWordBytes;
  if (cacheable && cache_.Lookup(word, ids)) return;
  const size_t start = ids->size();
  MergeWord(word, ids);
  if (cacheable) cache_.Insert(word, ids->data() + start, ids->size() - start);
}

void BpeModel::MergeWord(std::string_view word,
                         std::vector<int32_t>* ids) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<QueuedMerge> queue;
  thread_local std::string scratch;
  symbols.clear();
  queue.clear();
  auto add = [&](int32_t id, int32_t len) {
    const int32_t pos = static_cast<int32_t>(symbols.size());
    if (pos > 0) symbols.back().next = pos;
    symbols.push_back({id, pos - 1, -1, len});
  };

  int32_t unk_id = -1, unk_len = 0;  // a pending unk and its byte length
  size_t i = 0;
  while (i < word.size()) {
    const size_t begin = i;
    i += Utf8LeadLength(static_cast<unsigned char>(word[i]));
    if (i > word.size()) i = word.size();
    const int32_t byte_len = static_cast<int32_t>(i - begin);
    std::string_view s = word.substr(begin, byte_len);
    if ((begin > 0 && prefix_) || (i == word.size() && suffix_)) {
      scratch.clear();
      if (begin > 0 && prefix_) scratch.append(*prefix_);
      scratch.append(s);
      if (i == word.size() && suffix_) scratch.append(*suffix_);
      s = scratch;
    }
    if (auto it = vocab_.find(AbslView(s)); it != vocab_.end()) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(it->second, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : s) add(byte_ids_[c], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_id >= 0 && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = *unk_id_;
        unk_len = byte_len;
      }
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  // Merge the lowest-ranked pair first (leftmost on ties), like HF's
  // Word::merge_all without dropout.
  for (size_t p = 0; p + 1 < symbols.size(); ++p) {
    auto it = merges_.find(PairKey(symbols[p].id, symbols[p + 1].id));
    if (it != merges_.end()) {
      queue.push_back(
          {it->second.rank, static_cast<int32_t>(p), it->second.new_id});
    }
  }
  std::make_heap(queue.begin(), queue.end());
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end());
    const QueuedMerge top = queue.back();
    queue.pop_back();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    auto it = merges_.find(PairKey(cur.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      auto pit = merges_.find(PairKey(symbols[cur.prev].id, cur.id));
      if (pit != merges_.end()) {
        queue.push_back({pit->second.rank, cur.prev, pit->second.new_id});
        std::push_heap(queue.begin(), queue.end());
      }
    }
    if (cur.next >= 0) {
      auto nit = merges_.find(PairKey(cur.id, symbols[cur.next].id));
      if (nit != merges_.end()) {
        queue.push_back({nit->second.rank, top.pos, nit->second.new_id});
        std::push_heap(queue.begin(), queue.end());
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids->push_back(s.id);
  }
}

}  // namespace pdserve::tok
