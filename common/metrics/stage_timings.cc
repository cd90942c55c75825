#include "common/metrics/stage_timings.h"

#include "absl/strings/str_cat.h"

namespace pdserve::metrics {
namespace {

constexpr const char* kStageNames[kNumStages] = {
    "router_queue",     "prefill_queue",    "prefill_compute",   "kv_transfer",
    "kv_transfer_tail", "decode_admission", "first_decode_step", "decode"};

}  // namespace

const char* StageName(Stage stage) {
  return kStageNames[static_cast<int>(stage)];
}

std::optional<Stage> StageFromName(absl::string_view name) {
  for (Stage s : AllStages()) {
    if (name == StageName(s)) return s;
  }
  return std::nullopt;
}

const std::array<Stage, kNumStages>& AllStages() {
  static constexpr std::array<Stage, kNumStages> kAll = {
      Stage::kRouterQueue,     Stage::kPrefillQueue,   Stage::kPrefillCompute,
      Stage::kKvTransfer,      Stage::kKvTransferTail, Stage::kDecodeAdmission,
      Stage::kFirstDecodeStep, Stage::kDecode};
  return kAll;
}

double StageTimings::CriticalPathSeconds() const {
  double total = 0;
  for (Stage s : AllStages()) {
    if (s != Stage::kKvTransfer) total += Get(s).value_or(0.0);
  }
  return total;
}

std::string StageTimings::ToJson() const {
  std::string out = "{";
  for (Stage s : AllStages()) {
    if (!Get(s).has_value()) continue;
    absl::StrAppend(&out, out.size() > 1 ? "," : "", "\"", StageName(s),
                    "\":", *Get(s));
  }
  out += "}";
  return out;
}

}  // namespace pdserve::metrics
