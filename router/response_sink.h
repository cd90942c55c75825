// ResponseSink: where one request's responses go, whatever the protocol the
// client speaks (the gRPC Generate stream, an HTTP response with SSE or one
// JSON body). The generation pipeline (router/request_run.h) writes the same
// GenerateResponse messages to every kind of sink, so gRPC and HTTP share one
// pipeline. Implementations are thread-safe: Write and Finish may come from
// any thread (one at a time for a given request), Cancelled from any other.
#ifndef PDSERVE_ROUTER_RESPONSE_SINK_H_
#define PDSERVE_ROUTER_RESPONSE_SINK_H_

#include <optional>

#include "absl/status/status.h"
#include "pdserve/v1/generate.pb.h"

namespace pdserve {

// How a request ended, beyond its status (for the protocol's error details).
struct RequestEnd {
  absl::Status status;
  // RESOURCE_EXHAUSTED: when the client may retry (gRPC trailing metadata
  // retry-after-ms, HTTP Retry-After).
  std::optional<int> retry_after_ms;
};

class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // Queues `msg` for the client without blocking. False when the client is
  // gone (the pipeline then stops the request).
  virtual bool Write(const pdserve::v1::GenerateResponse& msg) = 0;
  // Called exactly once, last: OK after the final message was written, or
  // the error (before or after some messages).
  virtual void Finish(const RequestEnd& end) = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_RESPONSE_SINK_H_
