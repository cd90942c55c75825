// The run loop of `pdserve bench`: sends a dataset's requests to a backend
// (the router's gRPC API or an OpenAI-compatible server) at the times of the
// arrival process (with an optional concurrency cap) as streaming calls,
// records every stream, and prints a live progress line. One RunBenchmark
// call at a time per thread; internally the backends' callback threads and
// the dispatching thread share state under a mutex.
#ifndef PDSERVE_TOOLS_LOADGEN_RUNNER_H_
#define PDSERVE_TOOLS_LOADGEN_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pdserve/v1/generate.pb.h"
#include "tools/loadgen/backend.h"
#include "tools/loadgen/dataset.h"
#include "tools/loadgen/stats.h"

namespace pdserve::loadgen {

struct RunOptions {
  double request_rate = 0.0;  // infinity = all at once
  double burstiness = 1.0;
  int32_t max_concurrency = 0;  // 0 = unlimited
  uint64_t seed = 0;            // arrival process
  // Sampling, stopping and ignore_eos of every request; the prompt and
  // max_tokens come from the dataset.
  pdserve::v1::GenerateRequest request_template;
  absl::Duration request_timeout = absl::Minutes(10);
  bool progress = true;  // live progress line on stderr
};

// Runs the benchmark; returns one record per dataset request, in dataset
// order. Failed requests are records with a non-OK status, not an error.
absl::StatusOr<std::vector<RequestRecord>> RunBenchmark(
    BenchBackend& backend, const std::vector<BenchRequest>& requests,
    const RunOptions& options);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_TOOLS_LOADGEN_RUNNER_H_
