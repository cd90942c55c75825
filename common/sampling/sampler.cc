#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace pdserve {
namespace {

// Best first: larger value, then lower id.
struct ByValueDesc {
  const float* v;
  bool operator()(int32_t a, int32_t b) const {
    return v[a] != v[b] ? v[a] > v[b] : a < b;
  }
};

int32_t ArgMax(const std::vector<float>& v) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(v.size()); ++i) {
    if (v[i] > v[best]) best = i;  // strict: lowest id wins ties
  }
  return best;
}

}  // namespace

void Philox4x32(const uint32_t counter[4], const uint32_t key[2],
                uint32_t out[4]) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
  uint32_t k[2] = {key[0], key[1]};
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32),
                   lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32),
                   lo1 = static_cast<uint32_t>(p1);
    c[0] = hi1 ^ c[1] ^ k[0];
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ k[1];
    c[3] = lo0;
    k[0] += kW0;
    k[1] += kW1;
  }
  std::copy(c, c + 4, out);
}

double UniformForPosition(uint64_t seed, int64_t position) {
  const uint64_t pos = static_cast<uint64_t>(position);
  const uint32_t counter[4] = {static_cast<uint32_t>(pos),
                               static_cast<uint32_t>(pos >> 32), 0u, 0u};
  const uint32_t key[2] = {static_cast<uint32_t>(seed),
                           static_cast<uint32_t>(seed >> 32)};
  uint32_t out[4];
  Philox4x32(counter, key, out);
  const uint64_t bits =
      ((static_cast<uint64_t>(out[0]) << 32) | out[1]) >> 11;  // 53 bits
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(what);
  };
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return bad(absl::StrCat("temperature must be >= 0, got ", p.temperature));
  }
  if (p.top_k < -1)
    return bad(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return bad(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return bad(absl::StrCat("min_p must be in [0, 1], got ", p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return bad(absl::StrCat("repetition_penalty must be > 0, got ",
                            p.repetition_penalty));
  }
  if (!std::isfinite(p.presence_penalty) ||
      !std::isfinite(p.frequency_penalty)) {
    return bad("presence/frequency penalties must be finite");
  }
  if (p.top_logprobs < 0 || p.top_logprobs > 100) {
    return bad(
        absl::StrCat("top_logprobs must be in [0, 100], got ", p.top_logprobs));
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return bad(absl::StrCat("logit_bias of token ", id,
                              " must be in [-100, 100], got ", bias));
    }
  }
  return absl::OkStatus();
}

namespace {

// log Z of the raw logits (log_softmax = logit - log Z), in double.
double LogPartition(absl::Span<const float> logits) {
  double max_logit = -INFINITY;
  for (float l : logits) max_logit = std::max<double>(max_logit, l);
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  return max_logit + std::log(sum);
}

// `id`'s raw logprob and the k most likely tokens' into `result`.
void SetLogprobs(absl::Span<const float> logits, double log_z, int32_t id,
                 int k, SampledToken* result) {
  const int32_t V = static_cast<int32_t>(logits.size());
  auto logprob = [&](int32_t token) {
    return static_cast<float>(static_cast<double>(logits[token]) - log_z);
  };
  result->logprob = logprob(id);
  if (k <= 0) return;
  k = std::min<int>(k, V);
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    ByValueDesc{logits.data()});
  for (int i = 0; i < k; ++i) {
    result->top_logprobs.emplace_back(ids[i], logprob(ids[i]));
  }
}

}  // namespace

SampledToken ScoreToken(absl::Span<const float> logits, int32_t id,
                        int top_logprobs) {
  SampledToken result;
  result.id = id;
  SetLogprobs(logits, LogPartition(logits), id, top_logprobs, &result);
  const ByValueDesc before{logits.data()};
  result.rank = 1;
  for (int32_t t = 0; t < static_cast<int32_t>(logits.size()); ++t) {
    result.rank += before(t, id);
  }
  return result;
}

void ScorePromptChunk(absl::Span<const float> token_logits, int vocab,
                      absl::Span<const int32_t> prompt, int begin,
                      int top_logprobs, std::vector<SampledToken>* scores) {
  const int n = static_cast<int>(token_logits.size() / vocab);
  scores->resize(prompt.empty() ? 0 : prompt.size() - 1);
  for (int j = 0; j < n; ++j) {
    const size_t t = static_cast<size_t>(begin + j);
    if (t + 1 >= prompt.size()) break;
    (*scores)[t] =
        ScoreToken(token_logits.subspan(static_cast<size_t>(j) * vocab, vocab),
                   prompt[t + 1], top_logprobs);
  }
}

SampledToken SampleToken(absl::Span<const float> logits,
                         const SamplingParams& params,
                         absl::Span<const int32_t> prompt_ids,
                         absl::Span<const int32_t> output_ids, int64_t position,
                         absl::Span<const int32_t> banned) {
  const int32_t V = static_cast<int32_t>(logits.size());
  SampledToken result;
  const double log_z = LogPartition(logits);

  // Penalties.
  std::vector<float> l(logits.begin(), logits.end());
  if (params.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(prompt_ids.begin(), prompt_ids.end());
    seen.insert(output_ids.begin(), output_ids.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= V) continue;
      l[id] = l[id] > 0 ? l[id] / params.repetition_penalty
                        : l[id] * params.repetition_penalty;
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t id : output_ids) ++counts[id];
    for (const auto& [id, n] : counts) {
      if (id < 0 || id >= V) continue;
      l[id] -= params.frequency_penalty * static_cast<float>(n) +
               params.presence_penalty;
    }
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && id < V) l[id] += bias;
  }
  for (int32_t id : banned) {
    if (id >= 0 && id < V) l[id] = -INFINITY;
  }

  if (params.temperature <= 1e-6f) {
    result.id = ArgMax(l);
  } else {
    std::vector<int32_t> kept(V);
    std::iota(kept.begin(), kept.end(), 0);
    for (float& v : l) v = static_cast<float>(v / params.temperature);
    if (!banned.empty()) {  // not even the inverse CDF's last resort
      kept.erase(std::remove_if(kept.begin(), kept.end(),
                                [&](int32_t id) { return l[id] == -INFINITY; }),
                 kept.end());
    }
    const bool top_k = params.top_k > 0 && params.top_k < V;
    const bool top_p = params.top_p < 1.0f;
    if (top_k || top_p) {
      std::sort(kept.begin(), kept.end(), ByValueDesc{l.data()});
      if (top_k) kept.resize(params.top_k);
    }
    // Probabilities over the kept tokens (double).
    auto probs_of = [&](const std::vector<int32_t>& ids) {
      double m = -INFINITY;
      for (int32_t id : ids) m = std::max<double>(m, l[id]);
      std::vector<double> p(ids.size());
      double z = 0.0;
      for (size_t i = 0; i < ids.size(); ++i) {
        p[i] = std::exp(static_cast<double>(l[ids[i]]) - m);
        z += p[i];
      }
      for (double& x : p) x /= z;
      return p;
    };
    if (top_p) {
      // `kept` is sorted best first: keep the shortest prefix whose mass
      // reaches top_p (at least one token).
      const std::vector<double> p = probs_of(kept);
      double cum = 0.0;
      size_t n = 0;
      while (n < kept.size()) {
        cum += p[n++];
        if (cum >= params.top_p) break;
      }
      kept.resize(n);
    }
    if (params.min_p > 0.0f) {
      const std::vector<double> p = probs_of(kept);
      const double threshold =
          params.min_p * *std::max_element(p.begin(), p.end());
      std::vector<int32_t> filtered;
      for (size_t i = 0; i < kept.size(); ++i) {
        if (p[i] >= threshold) filtered.push_back(kept[i]);
      }
      kept.swap(filtered);
    }
    // Inverse CDF over the kept tokens in id order.
    std::sort(kept.begin(), kept.end());
    const std::vector<double> p = probs_of(kept);
    const double u = UniformForPosition(params.seed, position);
    double cum = 0.0;
    result.id = kept.back();
    for (size_t i = 0; i < kept.size(); ++i) {
      cum += p[i];
      if (u < cum) {
        result.id = kept[i];
        break;
      }
    }
  }
  SetLogprobs(logits, log_z, result.id, params.top_logprobs, &result);
  return result;
}

std::vector<int32_t> StopIdsBanned(const StopParams& stop, int output_len) {
  std::vector<int32_t> banned;
  if (output_len >= stop.min_tokens) return banned;
  if (!stop.ignore_eos) banned = stop.eos_ids;
  banned.insert(banned.end(), stop.stop_token_ids.begin(),
                stop.stop_token_ids.end());
  return banned;
}

std::string StopReason(const StopParams& stop, int32_t token,
                       int output_len_after_append) {
  if (!stop.ignore_eos && std::find(stop.eos_ids.begin(), stop.eos_ids.end(),
                                    token) != stop.eos_ids.end()) {
    return "stop";
  }
  if (std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(),
                token) != stop.stop_token_ids.end()) {
    return "stop";
  }
  if (output_len_after_append >= stop.max_tokens) return "length";
  return "";
}

}  // namespace pdserve
