// TimerQueue: functions run in time order, an entry earlier than the one
// awaited wakes the thread, and destruction runs what is still pending.
#include "router/timer_queue.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(TimerQueueTest, RunsInTimeOrderAndAnEarlierEntryWakesIt) {
  TimerQueue timers;
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification done;
  const absl::Time now = absl::Now();
  timers.RunAt(now + absl::Seconds(60), [] {});  // awaited first
  timers.RunAt(now + absl::Milliseconds(300), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(3);
    done.Notify();
  });
  timers.RunAt(now + absl::Milliseconds(100), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(2);
  });
  timers.RunAt(now, [&] {
    absl::MutexLock lock(&mu);
    order.push_back(1);
  });
  // Not after the 60 s entry: the earlier ones woke the thread.
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(TimerQueueTest, DestructionRunsWhatIsPendingAndLaterEntriesAtOnce) {
  std::atomic<int> ran{0};
  std::atomic<bool> saw_stopping{false};
  auto timers = std::make_unique<TimerQueue>();
  TimerQueue* raw = timers.get();
  EXPECT_FALSE(raw->stopping());
  timers->RunAt(absl::Now() + absl::Hours(1), [&] {
    saw_stopping = raw->stopping();
    ++ran;
    // Scheduled while stopping: runs at once, inline.
    raw->RunAt(absl::Now() + absl::Hours(1), [&] { ++ran; });
  });
  timers.reset();
  EXPECT_EQ(ran.load(), 2);
  EXPECT_TRUE(saw_stopping.load());
}

}  // namespace
}  // namespace pdserve
