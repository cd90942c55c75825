// gRPC backend of `pdserve bench`: a connection to the router's public
// Generation service (a few channels, so hundreds of concurrent streams are
// spread over several HTTP/2 connections), streaming Generate calls on
// gRPC's callback API, and the model facts the bench needs. Thread-safe
// after Connect (gRPC stubs are).
#ifndef PDSERVE_TOOLS_LOADGEN_CLIENT_H_
#define PDSERVE_TOOLS_LOADGEN_CLIENT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "pdserve/v1/generate.grpc.pb.h"
#include "tools/loadgen/backend.h"

namespace pdserve::loadgen {

class BenchClient : public BenchBackend {
 public:
  // Opens `num_channels` plaintext channels to `target` and waits up to
  // `timeout` for the router to answer GetModelInfo.
  static absl::StatusOr<std::unique_ptr<BenchClient>> Connect(
      const std::string& target, int num_channels, absl::Duration timeout);

  absl::StatusOr<ModelInfo> GetModelInfo(absl::Duration timeout) override;
  std::unique_ptr<BenchCall> NewCall(const BenchRequest& request, int32_t index,
                                     double scheduled_s, const CallSetup& setup,
                                     CallObserver* observer) override;

  // Stubs are used round-robin.
  pdserve::v1::Generation::Stub* NextStub();
  const std::string& target() const override { return target_; }

 private:
  BenchClient() = default;
  std::string target_;
  std::vector<std::unique_ptr<pdserve::v1::Generation::Stub>> stubs_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace pdserve::loadgen

#endif  // PDSERVE_TOOLS_LOADGEN_CLIENT_H_
