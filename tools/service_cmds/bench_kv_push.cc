#include "tools/service_cmds/bench_kv_push.h"

#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/transport/kv_wire.h"
#include "common/util/checksum.h"
#include "tools/bench_stats.h"
#include "tools/service_cmds/bench_kv_receiver.h"

namespace pdserve {

namespace pb = ::pdserve::v1::internal;

absl::Status PushKvOnce(transport::KvSender& sender, const std::string& target,
                        const KvLayout& layout, int tokens,
                        const std::string& src, const std::string& want,
                        KvPushPhases* phases) {
  KvPushPhases t;
  const double start = MonotonicSeconds();
  pb::KvHeader header;
  header.set_request_id("bench");
  header.set_model_fingerprint(kKvBenchFingerprint);
  *header.mutable_layout() = transport::LayoutToProto(layout);
  header.set_num_tokens(tokens);
  auto stream = sender.Open(target, header, absl::Now() + absl::Seconds(120));
  if (!stream.ok()) return stream.status();
  const int64_t bpt = layout.BytesPerTokenPerLayer();
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (auto [b, e] : transport::ChunkTokenRanges(
             0, tokens, bpt, transport::kKvChunkTargetBytes)) {
      const double t0 = MonotonicSeconds();
      pb::KvChunk c;
      c.set_layer(layer);
      c.set_token_begin(b);
      c.set_token_end(e);
      // Into the sender's memory, sealed on the way, as the prefill
      // worker's export does.
      std::unique_ptr<transport::KvChunkBuffer> bytes =
          sender.NewChunkBuffer(target, (e - b) * bpt);
      absl::Status filled = bytes->Fill([&](Stores stores) {
        c.set_xxh3(CopyWithXxh3(
            bytes->data(), src.data() + (int64_t{layer} * tokens + b) * bpt,
            (e - b) * bpt, stores));
        return absl::OkStatus();
      });
      if (!filled.ok()) return filled;
      const double t1 = MonotonicSeconds();
      absl::Status s = (*stream)->SendBuffer(std::move(c), std::move(bytes));
      const double t2 = MonotonicSeconds();
      t.seal += t1 - t0;
      t.post += t2 - t1;
      if (!s.ok()) return s;
    }
  }
  const double t0 = MonotonicSeconds();
  auto result = (*stream)->Commit(pb::KvCommit());
  t.commit = MonotonicSeconds() - t0;
  t.total = MonotonicSeconds() - start;
  if (!result.ok()) return result.status();
  if (result->transport != want) {
    return absl::InternalError(
        absl::StrCat("push went over ", result->transport, ", not ", want));
  }
  if (phases != nullptr) *phases = t;
  return absl::OkStatus();
}

nlohmann::json KvPushPhasesJson(const std::vector<KvPushPhases>& rounds) {
  nlohmann::json j;
  auto median_ms = [&](double KvPushPhases::*field) {
    std::vector<double> v;
    for (const KvPushPhases& r : rounds) v.push_back(r.*field * 1e3);
    return Median(v);
  };
  j["seal"] = median_ms(&KvPushPhases::seal);
  j["post"] = median_ms(&KvPushPhases::post);
  j["commit"] = median_ms(&KvPushPhases::commit);
  j["total"] = median_ms(&KvPushPhases::total);
  for (const KvPushPhases& r : rounds) {
    j["rounds"].push_back({{"seal", r.seal * 1e3},
                           {"post", r.post * 1e3},
                           {"commit", r.commit * 1e3},
                           {"total", r.total * 1e3}});
  }
  return j;
}

void PrintKvPushPhases(const std::string& name,
                       const std::vector<KvPushPhases>& rounds, int64_t bytes) {
  const nlohmann::json j = KvPushPhasesJson(rounds);
  std::string per_round;
  for (const auto& round : j["rounds"]) {
    absl::StrAppendFormat(&per_round, " %.0f/%.0f",
                          round["total"].get<double>(),
                          round["seal"].get<double>());
  }
  std::printf(
      "%s push on P, ms (medians): %.1f in all; seal %.1f (%.2f GB/s), "
      "post %.1f, commit %.1f; per round total/seal:%s\n",
      name.c_str(), j["total"].get<double>(), j["seal"].get<double>(),
      bytes / (j["seal"].get<double>() / 1e3) / 1e9, j["post"].get<double>(),
      j["commit"].get<double>(), per_round.c_str());
}

}  // namespace pdserve
