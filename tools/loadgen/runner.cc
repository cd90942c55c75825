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
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"
#include "tools/loadgen/arrival.h"
#include "tools/loadgen/report.h"

namespace pdserve::loadgen {
namespace {

// Seconds since `t0` on the monotonic clock.
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// Shared state of one run: in-flight count, progress counters and the
// finished records. Thread-safe (callbacks finish streams concurrently).
class RunState {
 public:
  explicit RunState(int32_t total) : records_(total) {}

  void Started() {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  void Finished(RequestRecord record) {
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

// One streaming Generate call, driven by gRPC's callback API. The reactor
// lives until the run ends (owned by the run's call list); its callbacks run
// on gRPC threads, one at a time for a given call.
class StreamCall
    : public grpc::ClientReadReactor<pdserve::v1::GenerateResponse> {
 public:
  StreamCall(const BenchRequest& request, int32_t index, double scheduled_s,
             const RunOptions& options, RunState* state,
             std::chrono::steady_clock::time_point t0)
      : recorder_(index, scheduled_s, request.input_tokens, request.is_long),
        state_(state),
        t0_(t0) {
    request_ = options.request_template;
    request_.set_request_id(absl::StrCat("bench-", index));
    if (!request.prompt_ids.empty()) {
      request_.mutable_token_ids()->mutable_ids()->Assign(
          request.prompt_ids.begin(), request.prompt_ids.end());
    } else {
      request_.set_text(request.prompt_text);
    }
    request_.set_max_tokens(request.max_tokens);
    ctx_.set_deadline(
        absl::ToChronoTime(absl::Now() + options.request_timeout));
  }

  void Start(pdserve::v1::Generation::Stub* stub) {
    state_->Started();
    recorder_.OnSent(Since(t0_));
    stub->async()->Generate(&ctx_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  // Ends the call early (OnDone still runs, with CANCELLED).
  void Cancel() { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    const double t = Since(t0_);
    recorder_.OnMessage(t, response_.tokens_size());
    if (response_.finished()) {
      final_message_s_ = t;
      recorder_.OnFinishReason(response_.finish_reason());
      if (response_.has_usage()) {
        recorder_.OnUsage(response_.usage().prompt_tokens(),
                          response_.usage().completion_tokens());
      }
      if (response_.has_timings()) AddStages(response_.timings());
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    const double t = Since(t0_);
    // A stream that delivered its final message ends there; the trailing
    // status adds nothing to the request's latency.
    const double end = status.ok() && final_message_s_ ? *final_message_s_ : t;
    state_->Finished(recorder_.Finish(end,
                                      static_cast<int32_t>(status.error_code()),
                                      status.error_message()));
  }

 private:
  // Records the stages the server reported (absent = did not happen, e.g.
  // kv_transfer in colocated mode).
  void AddStages(const pdserve::v1::StageTimings& t) {
    using T = pdserve::v1::StageTimings;
    struct Stage {
      const char* name;
      bool (T::*has)() const;
      double (T::*value)() const;
    };
    static constexpr Stage kStages[] = {
        {"router_queue", &T::has_router_queue, &T::router_queue},
        {"prefill_queue", &T::has_prefill_queue, &T::prefill_queue},
        {"prefill_compute", &T::has_prefill_compute, &T::prefill_compute},
        {"kv_transfer", &T::has_kv_transfer, &T::kv_transfer},
        {"kv_transfer_tail", &T::has_kv_transfer_tail, &T::kv_transfer_tail},
        {"decode_admission", &T::has_decode_admission, &T::decode_admission},
        {"first_decode_step", &T::has_first_decode_step, &T::first_decode_step},
        {"decode", &T::has_decode, &T::decode},
        {"server_e2e", &T::has_e2e, &T::e2e}};
    for (const Stage& st : kStages) {
      if ((t.*st.has)()) recorder_.OnStage(st.name, (t.*st.value)());
    }
  }

  StreamRecorder recorder_;
  RunState* state_;
  std::chrono::steady_clock::time_point t0_;
  grpc::ClientContext ctx_;
  pdserve::v1::GenerateRequest request_;
  pdserve::v1::GenerateResponse response_;
  std::optional<double> final_message_s_;
};

}  // namespace

absl::StatusOr<std::vector<RequestRecord>> RunBenchmark(
    BenchClient& client, const std::vector<BenchRequest>& requests,
    const RunOptions& options) {
  const int32_t n = static_cast<int32_t>(requests.size());
  const std::vector<double> arrivals =
      ArrivalOffsets(n, options.request_rate, options.burstiness, options.seed);
  RunState state(n);
  std::vector<std::unique_ptr<StreamCall>> calls;
  calls.reserve(n);
  const auto t0 = std::chrono::steady_clock::now();

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
        const std::string line = FormatProgress(state.Snapshot(Since(t0)));
        std::fprintf(stderr, tty ? "\r%s" : "%s\n", line.c_str());
        std::fflush(stderr);
      }
      const std::string line = FormatProgress(state.Snapshot(Since(t0)));
      std::fprintf(stderr, tty ? "\r%s\n" : "%s\n", line.c_str());
    });
  }

  for (int32_t i = 0; i < n; ++i) {
    const double wait = arrivals[i] - Since(t0);
    if (wait > 0) absl::SleepFor(absl::Seconds(wait));
    if (options.max_concurrency > 0) state.WaitForSlot(options.max_concurrency);
    calls.push_back(std::make_unique<StreamCall>(requests[i], i, arrivals[i],
                                                 options, &state, t0));
    calls.back()->Start(client.NextStub());
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
