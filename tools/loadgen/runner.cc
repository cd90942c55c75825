#include "tools/loadgen/runner.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tools/loadgen/arrival.h"
#include "tools/loadgen/report.h"

namespace pdserve::loadgen {
namespace {

// Shared state of one run: in-flight count, progress counters and the
// finished records. Thread-safe (callbacks finish streams concurrently).
class RunState : public CallObserver {
 public:
  explicit RunState(int32_t total) : records_(total) {}

  void Started() override {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  void Finished(RequestRecord record) override {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    ++done_;
    if (!record.ok()) ++failed_;
    output_tokens_ += record.output_tokens;
    const int32_t index = record.index;
    records_[index] = std::move(record);
  }
  // Blocks until fewer than `limit` calls are in flight.
  void WaitForSlot(int32_t limit) {
    absl::MutexLock lock(&mu_);
    auto has_slot = [this, limit]() {
      mu_.AssertHeld();
      return in_flight_ < limit;
    };
    mu_.Await(absl::Condition(&has_slot));
  }
  // Waits up to `timeout` for all calls to finish; true when all did.
  bool WaitAllDone(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    const int32_t total = static_cast<int32_t>(records_.size());
    auto all_done = [this, total]() {
      mu_.AssertHeld();
      return done_ == total;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&all_done), timeout);
  }
  ProgressSnapshot Snapshot(double elapsed_s) {
    absl::MutexLock lock(&mu_);
    return ProgressSnapshot{static_cast<int32_t>(records_.size()),
                            done_,
                            failed_,
                            in_flight_,
                            output_tokens_,
                            elapsed_s};
  }
  std::vector<RequestRecord> TakeRecords() {
    absl::MutexLock lock(&mu_);
    return std::move(records_);
  }

 private:
  absl::Mutex mu_;
  int32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t output_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::vector<RequestRecord>> RunBenchmark(
    BenchBackend& backend, const std::vector<BenchRequest>& requests,
    const RunOptions& options) {
  const int32_t n = static_cast<int32_t>(requests.size());
  const std::vector<double> arrivals =
      ArrivalOffsets(n, options.request_rate, options.burstiness, options.seed);
  RunState state(n);
  std::vector<std::unique_ptr<BenchCall>> calls;
  calls.reserve(n);
  const auto t0 = std::chrono::steady_clock::now();
  CallSetup setup;
  setup.request_template = options.request_template;
  setup.request_timeout = options.request_timeout;
  setup.t0 = t0;

  // Progress printer: a carriage-return line on a terminal, a line every
  // 5 s otherwise.
  absl::Notification stop_progress;
  std::thread progress;
  if (options.progress) {
    progress = std::thread([&] {
      const bool tty = isatty(fileno(stderr));
      const absl::Duration period =
          tty ? absl::Milliseconds(250) : absl::Seconds(5);
      while (!stop_progress.WaitForNotificationWithTimeout(period)) {
        const std::string line =
            FormatProgress(state.Snapshot(SecondsSince(t0)));
        std::fprintf(stderr, tty ? "\r%s" : "%s\n", line.c_str());
        std::fflush(stderr);
      }
      const std::string line = FormatProgress(state.Snapshot(SecondsSince(t0)));
      std::fprintf(stderr, tty ? "\r%s\n" : "%s\n", line.c_str());
    });
  }

  for (int32_t i = 0; i < n; ++i) {
    const double wait = arrivals[i] - SecondsSince(t0);
    if (wait > 0) absl::SleepFor(absl::Seconds(wait));
    if (options.max_concurrency > 0) state.WaitForSlot(options.max_concurrency);
    calls.push_back(
        backend.NewCall(requests[i], i, arrivals[i], setup, &state));
    calls.back()->Start();
  }
  // Every call has a deadline, so every call ends; the extra minute only
  // guards against a stream that ignores its deadline. Calls must not be
  // destroyed before their OnDone, hence cancel and wait.
  const bool all_done =
      state.WaitAllDone(options.request_timeout + absl::Minutes(1));
  if (!all_done) {
    for (auto& call : calls) call->Cancel();
    state.WaitAllDone(absl::InfiniteDuration());
  }
  if (progress.joinable()) {
    stop_progress.Notify();
    progress.join();
  }
  if (!all_done) {
    return absl::DeadlineExceededError("some streams ignored their deadline");
  }
  return state.TakeRecords();
}

}  // namespace pdserve::loadgen
