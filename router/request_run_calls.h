// The worker calls of one RequestRun, private to router/request_run.cc:
// the Prefill call and Decode stream in flight, an attempt's state, the
// load a worker carries for it, and the fire-and-forget Abort. Each object
// belongs to one run and is used on its queue (DecodeCall's callbacks post
// to it); none is shared between runs.
#ifndef PDSERVE_ROUTER_REQUEST_RUN_CALLS_H_
#define PDSERVE_ROUTER_REQUEST_RUN_CALLS_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"
#include "router/request_run.h"
#include "router/worker_pool.h"

namespace pdserve {
namespace request_run_internal {

// Tells a worker to drop a request (frees its KV now rather than at lease
// expiry). Fire and forget: the call owns itself until it completes.
inline void AbortAsync(const std::shared_ptr<WorkerEndpoint>& ep,
                       const std::string& worker_request_id) {
  if (ep == nullptr) return;
  struct AbortCall {
    grpc::ClientContext ctx;
    pb::AbortRequest req;
    pb::AbortResponse resp;
    std::shared_ptr<WorkerEndpoint> ep;  // keeps the stub alive
  };
  auto call = std::make_shared<AbortCall>();
  call->ep = ep;
  call->ctx.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
  call->req.set_request_id(worker_request_id);
  ep->worker->async()->Abort(&call->ctx, &call->req, &call->resp,
                             [call](grpc::Status) {});
}

// Counts a request against a worker's load while an attempt uses it.
class LoadToken {
 public:
  explicit LoadToken(std::shared_ptr<WorkerEndpoint> ep) : ep_(std::move(ep)) {
    ep_->in_flight.fetch_add(1);
  }
  ~LoadToken() { ep_->in_flight.fetch_sub(1); }
  LoadToken(const LoadToken&) = delete;
  LoadToken& operator=(const LoadToken&) = delete;

 private:
  std::shared_ptr<WorkerEndpoint> ep_;
};

}  // namespace request_run_internal

// A unary Prefill call in flight: context, request and response live until
// its callback has run.
struct RequestRun::PrefillCall {
  grpc::ClientContext ctx;
  pb::PrefillRequest req;
  pb::PrefillResponse resp;
  absl::Time start;
};

// A Decode stream in flight (colocated: D prefills; disaggregated: D's first
// message says the KV is complete and verified). Reads are forwarded to the
// run's queue in order; the reactor stays alive until OnDone (it holds itself
// until then) and while the attempt holds it.
class RequestRun::DecodeCall
    : public grpc::ClientReadReactor<pb::DecodeResponse> {
 public:
  DecodeCall(std::shared_ptr<RequestRun> run, int attempt_no)
      : run_(std::move(run)), attempt_no_(attempt_no) {}

  void Start(const std::shared_ptr<DecodeCall>& self, pb::Decode::Stub* stub) {
    self_ = self;
    stub->async()->Decode(&ctx, &req, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    run_->queue_.Post([run = run_, n = attempt_no_, msg = msg_] {
      run->OnDecodeMessage(n, msg);
    });
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& status) override {
    run_->queue_.Post([run = run_, n = attempt_no_, status] {
      run->OnDecodeDone(n, status);
    });
    run_.reset();
    self_.reset();  // may delete this
  }

  grpc::ClientContext ctx;
  pb::DecodeRequest req;

 private:
  std::shared_ptr<RequestRun> run_;
  const int attempt_no_;
  pb::DecodeResponse msg_;
  std::shared_ptr<DecodeCall> self_;
};

// One try of the request on a (P, D) pair.
struct RequestRun::Attempt {
  std::string worker_request_id;            // worker key + attempt number
  std::shared_ptr<WorkerEndpoint> prefill;  // null: prefill on D
  std::shared_ptr<WorkerEndpoint> decode;
  std::optional<request_run_internal::LoadToken> prefill_load, decode_load;
  WorkerEndpoint* failed = nullptr;  // which worker the error came from
  ::pdserve::v1::StageTimings timings;
  std::shared_ptr<PrefillCall> prefill_call;
  std::shared_ptr<DecodeCall> decode_call;
  // Disaggregated: the first token, released once D has the KV.
  std::optional<::pdserve::v1::GeneratedToken> first_token;
  // and P's prompt logprobs (when asked), released with it.
  google::protobuf::RepeatedPtrField<::pdserve::v1::GeneratedToken>
      prompt_logprobs;
  bool awaiting_admission = false;
  absl::Time prefill_rpc_start;
  double prefill_queue_seconds = 0, prefill_compute_seconds = 0;
  absl::Status protocol_error;  // D broke the protocol (set before cancel)
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_REQUEST_RUN_CALLS_H_
