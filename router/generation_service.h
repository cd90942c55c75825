// GenerationService: the router's public Generation API. For each request it
// validates and tokenizes, picks a decode worker and (disaggregated) a
// prefill worker (prefix-aware: see RouterOptions), runs Prefill then claims
// the sequence on the decode worker and streams its tokens back with
// incremental detokenization and stop strings. Retries another worker on
// UNAVAILABLE / RESOURCE_EXHAUSTED while no token has reached the client,
// and migrates a stream whose decode worker failed mid-stream (prompt +
// tokens sent so far, on another pair; the client's stream continues);
// --mode=auto chooses where to prefill with router/disaggregation_policy.h;
// client cancellation and deadlines reach P and D at once (propagated contexts
// + Abort). Records every request in RouterMetrics (latencies, tokens, status
// codes, stage timings) and returns the stage timings in the final message.
// Thread-safe.
#ifndef PDSERVE_ROUTER_GENERATION_SERVICE_H_
#define PDSERVE_ROUTER_GENERATION_SERVICE_H_

#include <atomic>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/router_metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/cost_fit.h"
#include "pdserve/v1/generate.grpc.pb.h"
#include "router/client_stream.h"
#include "router/request_builder.h"
#include "router/worker_pool.h"

namespace pdserve {

// The stages set in a request's final timings (proto field names are the
// stage names of common/metrics/stage_timings.h; e2e is not a stage).
metrics::StageTimings StageTimingsFromProto(
    const pdserve::v1::StageTimings& timings);

enum class RouterMode { kDisaggregated, kColocated, kAuto };
absl::StatusOr<RouterMode> ParseRouterMode(const std::string& s);
const char* RouterModeName(RouterMode mode);

struct RouterOptions {
  RouterMode mode = RouterMode::kDisaggregated;
  int auto_prefill_threshold =
      32;  // auto: prompts shorter than this prefill on D
  // auto: weight of the decode stall a prefill on D causes to each of its
  // running sequences (router/disaggregation_policy.h).
  double auto_stall_weight = 1.0;
  // Tries per request before any token reached the client.
  int max_attempts = 3;
  // Times a stream may move to another (P, D) pair after tokens reached the
  // client (its decode worker failed); 0 = never (the client gets the
  // failure).
  int max_migrations = 2;
  RequestLimits limits;
  // Prefix-aware prefill routing: prompts sharing their first
  // prefix_routing_blocks blocks of kv_block_size tokens go to the same
  // prefill worker (whose prefix cache then holds them) unless it is busier
  // than the least loaded by more than prefix_routing_max_extra_load. 0 = off.
  int prefix_routing_blocks = 2;
  int kv_block_size = 16;
  double prefix_routing_max_extra_load = 2.0;
  // Admission control: requests in flight at most (0 = unbounded); beyond,
  // and whenever the workers' bounded queues refuse a request on every
  // attempt, the answer is RESOURCE_EXHAUSTED with trailing metadata
  // `retry-after-ms: retry_after_ms`.
  int max_in_flight = 1024;
  int retry_after_ms = 100;
};

// Trailing metadata key of the retry hint on RESOURCE_EXHAUSTED.
inline constexpr char kRetryAfterMsKey[] = "retry-after-ms";

class GenerationService final : public pdserve::v1::Generation::Service {
 public:
  // `tokenizer` may be null (token-id input only). Pools and `metrics` must
  // outlive this.
  GenerationService(RouterOptions options, RouterModelInfo model,
                    std::unique_ptr<Tokenizer> tokenizer, WorkerPool* prefill,
                    WorkerPool* decode, metrics::RouterMetrics* metrics);

  grpc::Status Generate(
      grpc::ServerContext* context, const pdserve::v1::GenerateRequest* request,
      grpc::ServerWriter<pdserve::v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context,
                        const pdserve::v1::TokenizeRequest* request,
                        pdserve::v1::TokenizeResponse* response) override;
  grpc::Status GetModelInfo(
      grpc::ServerContext* context,
      const pdserve::v1::GetModelInfoRequest* request,
      pdserve::v1::GetModelInfoResponse* response) override;

  void StartDraining() { draining_.store(true); }
  int in_flight() const { return in_flight_.load(); }

 private:
  using Stream = ClientStream;
  struct Attempt;
  // Generate without the request's metrics, which Generate records from
  // `stream` (null until the request is resolved) and the status.
  grpc::Status Serve(grpc::ServerContext* context,
                     const pdserve::v1::GenerateRequest* request,
                     grpc::ServerWriter<pdserve::v1::GenerateResponse>* writer,
                     absl::Time arrival, std::unique_ptr<Stream>* stream);
  // Picks where `a` prefills (sets a.prefill unless on D, and the decision
  // in a.timings); `a.decode` is already picked.
  absl::Status ChoosePrefill(int prompt_tokens,
                             const std::set<std::string>& exclude_p,
                             const PickHint& hint, Attempt& a);
  absl::Status RunDisaggregated(grpc::ServerContext* context, Stream& stream,
                                Attempt& attempt);
  absl::Status RunColocated(grpc::ServerContext* context, Stream& stream,
                            Attempt& attempt);
  // Reads D's stream until its end, forwarding tokens to the client.
  absl::Status PumpDecode(
      grpc::ClientContext& dctx,
      grpc::ClientReaderInterface<pb::DecodeResponse>& reader, Stream& stream,
      Attempt& attempt);
  void AbortOn(WorkerEndpoint* ep, const std::string& worker_request_id);

  const RouterOptions options_;
  const RouterModelInfo model_;
  const std::unique_ptr<Tokenizer> tokenizer_;
  WorkerPool* const prefill_;
  WorkerPool* const decode_;
  metrics::RouterMetrics* const metrics_;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> next_id_{1};
  Ewma handoff_seconds_;  // see DisaggregationInputs::handoff_seconds
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_GENERATION_SERVICE_H_
