// GenerationService: the router's public gRPC API (pdserve.v1.Generation) on
// gRPC's callback API: a Generate call becomes a GenerateRequest and a
// ResponseSink that writes the stream (one write in flight, the rest queued),
// handed to the GenerationCore, which runs it asynchronously (no thread per
// stream). Client cancellation and deadlines reach the core at once;
// RESOURCE_EXHAUSTED carries the trailing metadata retry-after-ms. Generate
// and Tokenize take their requests as raw bytes and parse them here, so a
// request that protobuf cannot parse (a string field that is not UTF-8) gets
// INVALID_ARGUMENT naming the field instead of gRPC's generic error.
// Thread-safe.
#ifndef PDSERVE_ROUTER_GENERATION_SERVICE_H_
#define PDSERVE_ROUTER_GENERATION_SERVICE_H_

#include "pdserve/v1/generate.grpc.pb.h"
#include "router/generation_core.h"

namespace pdserve {

namespace generation_service_internal {
using v1g = ::pdserve::v1::Generation;
using Base =
    v1g::WithRawCallbackMethod_Generate<v1g::WithRawCallbackMethod_Tokenize<
        v1g::WithCallbackMethod_GetModelInfo<v1g::Service>>>;
}  // namespace generation_service_internal

class GenerationService final : public generation_service_internal::Base {
 public:
  // `core` must outlive this.
  explicit GenerationService(GenerationCore* core) : core_(core) {}

  // Request: a serialized GenerateRequest; each response a serialized
  // GenerateResponse.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(
      grpc::CallbackServerContext* context,
      const pdserve::v1::GetModelInfoRequest* request,
      pdserve::v1::GetModelInfoResponse* response) override;

 private:
  GenerationCore* const core_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_GENERATION_SERVICE_H_
