#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/util/adaptive_stores.h"
#include "common/util/mutex_debugging.h"
#include "common/util/scoped_env.h"
#include "common/util/status_macros.h"
#include "common/util/system_memory.h"
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

// A cgroup's memory limit less its usage, as a container sees it (v1 and
// v2, the process's own cgroup or the namespace's root), or none.
TEST(SystemMemory, CgroupHeadroomFromV1AndV2Files) {
  std::map<std::string, std::string> files;
  auto read = [&](const std::string& path) -> std::optional<std::string> {
    auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  };
  // v1, the process's cgroup path present under the mount.
  files = {{"/sys/fs/cgroup/memory/pod/memory.limit_in_bytes", "4294967296\n"},
           {"/sys/fs/cgroup/memory/pod/memory.usage_in_bytes", "1073741824\n"}};
  EXPECT_EQ(CgroupHeadroom("5:cpu:/\n4:memory:/pod\n0::/\n", read),
            int64_t{3} << 30);
  // v1 inside a cgroup namespace: the files are at the mount's root.
  files = {{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "2147483648"},
           {"/sys/fs/cgroup/memory/memory.usage_in_bytes", "3000000000"}};
  EXPECT_EQ(CgroupHeadroom("4:memory:/elsewhere\n", read), 0);
  // v1 without a limit (a huge number).
  files = {
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712"}};
  EXPECT_EQ(CgroupHeadroom("4:memory:/\n", read), std::nullopt);
  // Page cache in the cgroup (reclaimable) does not count as used.
  files = {{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "4294967296"},
           {"/sys/fs/cgroup/memory/memory.usage_in_bytes", "3221225472"},
           {"/sys/fs/cgroup/memory/memory.stat",
            "cache 2147483648\nactive_file 5\ntotal_active_file "
            "1073741824\ntotal_inactive_file 1073741824\n"}};
  EXPECT_EQ(CgroupHeadroom("4:memory:/\n", read), int64_t{3} << 30);
  // v2 with a limit, and with "max".
  files = {{"/sys/fs/cgroup/kubepods/x/memory.max", "1073741824\n"},
           {"/sys/fs/cgroup/kubepods/x/memory.current", "83741824\n"},
           {"/sys/fs/cgroup/kubepods/x/memory.stat",
            "anon 73741824\nactive_file 6000000\ninactive_file 4000000\n"}};
  EXPECT_EQ(CgroupHeadroom("0::/kubepods/x\n", read), int64_t{1000000000});
  files = {{"/sys/fs/cgroup/memory.max", "max\n"}};
  EXPECT_EQ(CgroupHeadroom("0::/\n", read), std::nullopt);
  EXPECT_EQ(CgroupHeadroom("", read), std::nullopt);
  // This process: something positive, never above MemAvailable.
  auto now = AvailableMemoryNow();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_GT(now->bytes, 0);
  EXPECT_LE(now->bytes, now->mem_available);
  EXPECT_NE(now->Describe().find("MemAvailable"), std::string::npos);
}

}  // namespace
// Locks a then b, then b then a: a lock-order cycle.
void InvertLockOrder() {
  absl::Mutex a, b;
  {
    absl::MutexLock la(&a);
    absl::MutexLock lb(&b);
  }
  absl::MutexLock lb(&b);
  absl::MutexLock la(&a);
}

TEST(MutexDebugging, ModeComesFromTheEnvironment) {
  {
    ScopedEnv env("PDSERVE_MUTEX_DEADLOCK_DETECTION", "bogus");
    EXPECT_NE(ConfigureMutexDeadlockDetection().find("off, report, abort"),
              std::string::npos);
  }
  for (const char* value : {"", "off", "report"}) {
    ScopedEnv env("PDSERVE_MUTEX_DEADLOCK_DETECTION", value);
    EXPECT_EQ(ConfigureMutexDeadlockDetection(), "") << value;
    InvertLockOrder();  // at most reported: the process goes on
  }
  ScopedEnv env("PDSERVE_MUTEX_DEADLOCK_DETECTION", "abort");
  EXPECT_EQ(ConfigureMutexDeadlockDetection(), "");
  // Debian's libabsl tracks lock order (a debug build); the test suite
  // relies on that to fail on an inversion (DESIGN.md, Conventions).
  EXPECT_DEATH(InvertLockOrder(), "[Cc]ycle|deadlock");
}

}  // namespace pdserve
