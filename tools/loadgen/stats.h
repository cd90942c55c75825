// Per-request measurements of a benchmark run and the arithmetic that turns
// them into the report (throughputs, goodput under SLOs, latency
// percentiles). Pure data and functions; no clocks are read here.
#ifndef PDSERVE_TOOLS_LOADGEN_STATS_H_
#define PDSERVE_TOOLS_LOADGEN_STATS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pdserve::loadgen {

// One streamed response message that carried `tokens` (>= 1) output tokens,
// received `t_s` seconds after the start of the run.
struct TokenChunk {
  double t_s = 0.0;
  int32_t tokens = 0;
};

// A server-measured stage duration from the final response message.
struct StageTiming {
  std::string stage;
  double seconds = 0.0;
};

// What the bench observed for one request. Times are seconds since the start
// of the run, all read from one monotonic clock of the bench process.
struct RequestRecord {
  int32_t index = 0;
  double scheduled_s = 0.0;  // planned arrival (arrival process)
  double sent_s = 0.0;       // the call started (after any concurrency wait)
  double end_s = 0.0;        // the stream ended (status received)
  std::vector<TokenChunk> chunks;
  int32_t input_tokens = 0;   // server usage when reported, else the dataset's
  int32_t output_tokens = 0;  // sum of chunk tokens
  int32_t status_code = 0;    // gRPC/absl status code, 0 = OK
  std::string error_message;
  std::string finish_reason;
  bool is_long = false;  // `mixed` dataset class
  std::vector<StageTiming> stages;

  bool ok() const { return status_code == 0; }
  // Latencies in milliseconds; nullopt where undefined.
  std::optional<double> TtftMs() const;  // first token chunk - sent
  std::optional<double> E2eMs() const;   // end - sent
  // (E2E - TTFT) / (output_tokens - 1); undefined for outputs of < 2 tokens.
  std::optional<double> TpotMs() const;
  // Gaps between consecutive token-carrying messages (one per message, as
  // vLLM's bench does; a message with k tokens is one gap).
  std::vector<double> ItlMs() const;
};

// Builds the RequestRecord of one response stream from its events, in
// order. The gRPC client feeds it from a live stream; tests feed it a fake
// stream with known timings. Not thread-safe (one stream's events are
// sequential).
class StreamRecorder {
 public:
  // `dataset_input_tokens`: the prompt length the bench knows (0 for text).
  StreamRecorder(int32_t index, double scheduled_s,
                 int32_t dataset_input_tokens, bool is_long);
  void OnSent(double t_s);
  // A response message carrying `num_tokens` output tokens (0 is allowed,
  // e.g. a final message with only usage and timings).
  void OnMessage(double t_s, int32_t num_tokens);
  // Server-reported usage; the prompt token count replaces the dataset's.
  void OnUsage(int32_t prompt_tokens, int32_t completion_tokens);
  void OnFinishReason(std::string reason);
  void OnStage(std::string stage, double seconds);
  // The stream ended with this status; returns the finished record.
  RequestRecord Finish(double t_s, int32_t status_code, std::string message);
  // Completion tokens from the server's usage (-1 if none was reported).
  int32_t usage_completion_tokens() const { return usage_completion_tokens_; }
  // For protocols whose messages do not say how many tokens they carry (an
  // OpenAI SSE chunk is counted as one): when the server's usage reports
  // more, the difference goes to the last message, so the total is exact.
  void ReconcileWithUsage();

 private:
  RequestRecord record_;
  int32_t usage_completion_tokens_ = -1;
};

// Service-level objectives; an unset field is not checked.
struct SloSpec {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2e_ms;
  bool any() const { return ttft_ms || tpot_ms || e2e_ms; }
};

// A request is good when it succeeded and meets every set SLO (a TPOT SLO is
// met trivially by a request with < 2 output tokens, which has no TPOT).
bool MeetsSlo(const RequestRecord& r, const SloSpec& slo);

// Percentile by linear interpolation between closest ranks (numpy's default,
// "linear"): rank = p/100 * (n-1), value = a[floor] + frac * (a[ceil] -
// a[floor]) over the sorted values. p in [0, 100]; empty input gives 0.
double Percentile(std::vector<double> values, double p);

struct LatencySummary {
  int64_t count = 0;
  double mean = 0.0, median = 0.0, p90 = 0.0, p99 = 0.0, max = 0.0;
};
LatencySummary Summarize(const std::vector<double>& values);

// Latencies of one prompt class of the `mixed` dataset.
struct ClassLatency {
  int32_t completed = 0;
  LatencySummary ttft_ms, tpot_ms;
};

struct BenchMetrics {
  int32_t num_requests = 0;
  int32_t completed = 0;  // status OK
  int32_t failed = 0;
  double duration_s = 0.0;
  int64_t total_input_tokens = 0;   // of completed requests
  int64_t total_output_tokens = 0;  // of completed requests
  double request_throughput = 0.0;  // completed / duration
  double input_throughput = 0.0;    // tokens/s
  double output_throughput = 0.0;   // tokens/s
  int32_t good_requests = 0;
  double goodput = 0.0;         // good requests / duration
  double slo_attainment = 0.0;  // good requests / all requests
  LatencySummary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  std::map<std::string, int32_t> errors_by_code;   // code name -> count
  std::map<std::string, LatencySummary> stage_ms;  // server stage timings
  // "short" and "long" prompts, only when the run had long ones (`mixed`):
  // the TPOT of short requests is where prefill interference shows.
  std::map<std::string, ClassLatency> by_class;
};

// Aggregates a run. `duration_s` is the wall time of the run (first send to
// last end). Latencies are over completed requests only.
BenchMetrics ComputeMetrics(const std::vector<RequestRecord>& records,
                            double duration_s, const SloSpec& slo);

// Duration of a run from its records: max(end) - min(sent); 0 if empty.
double RunDuration(const std::vector<RequestRecord>& records);

// The canonical name of a gRPC/absl status code (same numbering), e.g.
// "UNAVAILABLE".
std::string StatusCodeName(int32_t code);

// One point of a request-rate sweep.
struct SweepPoint {
  double request_rate = 0.0;
  BenchMetrics metrics;
};
// Index of the point with the highest goodput (the lowest rate on ties);
// -1 when empty.
int PeakGoodputIndex(const std::vector<SweepPoint>& points);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_TOOLS_LOADGEN_STATS_H_
