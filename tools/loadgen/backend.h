// Where `pdserve bench` sends its requests: a BenchBackend starts streaming
// calls for dataset requests (the router's gRPC API in client.h, or any
// OpenAI-compatible HTTP server in openai_backend.h), and each call reports
// its progress to a StreamRecorder and its end to a CallObserver. The run
// loop (runner.h) is the same for every backend. Backends are thread-safe.
#ifndef PDSERVE_TOOLS_LOADGEN_BACKEND_H_
#define PDSERVE_TOOLS_LOADGEN_BACKEND_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pdserve/v1/generate.pb.h"
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/stats.h"

namespace pdserve::loadgen {

struct ModelInfo {
  std::string model;
  std::string mode;
  int32_t vocab_size = 0;
  int32_t max_context = 0;  // 0 = unknown
  int32_t num_prefill_workers = 0;
  int32_t num_decode_workers = 0;
};

// Hears the start and the end of every call (thread-safe: calls end on the
// backends' threads).
class CallObserver {
 public:
  virtual ~CallObserver() = default;
  virtual void Started() = 0;
  virtual void Finished(RequestRecord record) = 0;
};

// One request in flight. Destroyed only after its Finished was reported.
class BenchCall {
 public:
  virtual ~BenchCall() = default;
  virtual void Start() = 0;
  // Ends the call early (Finished still follows).
  virtual void Cancel() = 0;
};

// What every call of a run shares.
struct CallSetup {
  // Sampling, stopping and ignore_eos of every request; the prompt and
  // max_tokens come from the dataset.
  pdserve::v1::GenerateRequest request_template;
  absl::Duration request_timeout = absl::Minutes(10);
  std::chrono::steady_clock::time_point t0;  // the run's clock origin
};

class BenchBackend {
 public:
  virtual ~BenchBackend() = default;
  virtual const std::string& target() const = 0;
  virtual absl::StatusOr<ModelInfo> GetModelInfo(absl::Duration timeout) = 0;
  virtual std::unique_ptr<BenchCall> NewCall(const BenchRequest& request,
                                             int32_t index, double scheduled_s,
                                             const CallSetup& setup,
                                             CallObserver* observer) = 0;
};

// Seconds since `t0` on the monotonic clock.
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace pdserve::loadgen

#endif  // PDSERVE_TOOLS_LOADGEN_BACKEND_H_
