#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/util/adaptive_stores.h"
#include "common/util/status_macros.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckQuarter(int x) {
  RETURN_IF_ERROR(Quarter(x).status());
  return absl::OkStatus();
}

TEST(StatusMacros, PropagateErrorsAndValues) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckQuarter(4).ok());
  EXPECT_EQ(CheckQuarter(2).message(), "odd");
}

// Counts the streaming choices among the next `n`.
int StreamingChoices(AdaptiveStores& a, int n) {
  int streaming = 0;
  for (int i = 0; i < n; ++i) streaming += a.Choose() == Stores::kStreaming;
  return streaming;
}

constexpr int64_t kChunk = int64_t{4} << 20;

TEST(AdaptiveStores, OrdinaryStoresUntilStreamingMeasuresFasterByTheMargin) {
  AdaptiveStores a(std::nullopt);
  // Nothing measured: ordinary stores, with one probe per kProbeEvery.
  EXPECT_EQ(StreamingChoices(a, 4 * AdaptiveStores::kProbeEvery), 4);
  // Ordinary 1.2x slower than streaming: inside the margin, no change.
  for (int i = 0; i < 8; ++i) {
    a.Report(Stores::kCached, kChunk, 1.2e-3);
    a.Report(Stores::kStreaming, kChunk, 1.0e-3);
  }
  EXPECT_EQ(StreamingChoices(a, 2 * AdaptiveStores::kProbeEvery), 2);
  // Ordinary 4x slower (the slow phase): streaming, probing ordinary.
  for (int i = 0; i < 8; ++i) a.Report(Stores::kCached, kChunk, 4e-3);
  EXPECT_EQ(StreamingChoices(a, 2 * AdaptiveStores::kProbeEvery),
            2 * AdaptiveStores::kProbeEvery - 2);
  // (weighted: 8 reports leave a tenth of the old estimate)
  EXPECT_NEAR(a.SecondsPerGb(Stores::kCached), 4e-3 / (kChunk / 1e9), 0.1);
  // The probes find ordinary stores fast again: back to them.
  for (int i = 0; i < 8; ++i) a.Report(Stores::kCached, kChunk, 0.8e-3);
  EXPECT_EQ(StreamingChoices(a, 2 * AdaptiveStores::kProbeEvery), 2);
}

TEST(AdaptiveStores, IgnoresFillsTooSmallToTimeAndHonoursAPin) {
  AdaptiveStores a(std::nullopt);
  a.Report(Stores::kCached, AdaptiveStores::kMinMeasuredBytes - 1, 1.0);
  a.Report(Stores::kCached, kChunk, 0);
  EXPECT_EQ(a.SecondsPerGb(Stores::kCached), 0);
  AdaptiveStores pinned(Stores::kStreaming);
  pinned.Report(Stores::kStreaming, kChunk, 1.0);
  EXPECT_EQ(StreamingChoices(pinned, 100), 100);
  EXPECT_EQ(pinned.SecondsPerGb(Stores::kStreaming), 0);
  // PDSERVE_KV_EXPORT_STORES pins a default-constructed one; anything
  // else leaves it adaptive.
  setenv("PDSERVE_KV_EXPORT_STORES", "cached", 1);
  AdaptiveStores cached;
  for (int i = 0; i < 8; ++i) cached.Report(Stores::kCached, kChunk, 1.0);
  EXPECT_EQ(StreamingChoices(cached, 100), 0);
  setenv("PDSERVE_KV_EXPORT_STORES", "streaming", 1);
  AdaptiveStores streaming;
  EXPECT_EQ(StreamingChoices(streaming, 100), 100);
  setenv("PDSERVE_KV_EXPORT_STORES", "bogus", 1);
  AdaptiveStores adaptive;
  EXPECT_EQ(StreamingChoices(adaptive, AdaptiveStores::kProbeEvery), 1);
  unsetenv("PDSERVE_KV_EXPORT_STORES");
}

TEST(AdaptiveStores, ManyThreadsChooseAndReport) {
  AdaptiveStores a(std::nullopt);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&a, t] {
      for (int i = 0; i < 2000; ++i) {
        const Stores s = a.Choose();
        a.Report(s, kChunk,
                 s == Stores::kCached ? 4e-3 * (t + 1) : 1e-3 * (t + 1));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(a.SecondsPerGb(Stores::kCached),
            a.SecondsPerGb(Stores::kStreaming));
  EXPECT_GT(StreamingChoices(a, 64), 32);
}

}  // namespace
}  // namespace pdserve
