// GenerationService: the router's public gRPC API (pdserve.v1.Generation) on
// gRPC's callback API: a Generate call becomes a GenerateRequest and a
// ResponseSink that writes the stream (one write in flight, the rest queued),
// handed to the GenerationCore, which runs it asynchronously (no thread per
// stream). Client cancellation and deadlines reach the core at once;
// RESOURCE_EXHAUSTED carries the trailing metadata retry-after-ms.
// Thread-safe.
#ifndef PDSERVE_ROUTER_GENERATION_SERVICE_H_
#define PDSERVE_ROUTER_GENERATION_SERVICE_H_

#include "pdserve/v1/generate.grpc.pb.h"
#include "router/generation_core.h"

namespace pdserve {

class GenerationService final
    : public pdserve::v1::Generation::CallbackService {
 public:
  // `core` must outlive this.
  explicit GenerationService(GenerationCore* core) : core_(core) {}

  grpc::ServerWriteReactor<pdserve::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const pdserve::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(
      grpc::CallbackServerContext* context,
      const pdserve::v1::TokenizeRequest* request,
      pdserve::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(
      grpc::CallbackServerContext* context,
      const pdserve::v1::GetModelInfoRequest* request,
      pdserve::v1::GetModelInfoResponse* response) override;

 private:
  GenerationCore* const core_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_GENERATION_SERVICE_H_
