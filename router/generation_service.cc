#include "router/generation_service.h"

#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_util/grpc_util.h"
#include "common/grpc_util/raw_proto.h"

namespace pdserve {

namespace v1 = ::pdserve::v1;

namespace {

// One Generate call: the reactor gRPC drives and the ResponseSink the
// pipeline writes to. It owns itself (self_) until gRPC's OnDone; the
// pipeline holds it through the sink's shared_ptr, and after OnDone its
// writes are refused.
class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                              public ResponseSink {
 public:
  explicit GenerateReactor(grpc::CallbackServerContext* context)
      : context_(context) {}

  void Begin(std::shared_ptr<GenerateReactor> self, GenerationCore* core,
             const grpc::ByteBuffer& bytes) {
    self_ = self;
    v1::GenerateRequest request;
    if (absl::Status parsed = ParseRawProto(bytes, &request); !parsed.ok()) {
      Finish(RequestEnd{parsed, std::nullopt});
      return;
    }
    handle_ = core->Generate(request, absl::FromChrono(context_->deadline()),
                             std::move(self));
  }

  // gRPC may run reactions on the thread that starts an operation, so the
  // lock is never held across StartWrite or Finish.
  bool Write(const v1::GenerateResponse& msg) override {
    const grpc::ByteBuffer* start = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (done_ || client_gone_ || finishing_) return false;
      // deque: the front's address stays valid
      queue_.push_back(SerializeToByteBuffer(msg));
      if (!writing_) {
        writing_ = true;
        start = &queue_.front();
      }
    }
    if (start != nullptr) StartWrite(start);
    return true;
  }

  void Finish(const RequestEnd& end) override {
    {
      absl::MutexLock lock(&mu_);
      if (done_ || finishing_) return;
      finishing_ = true;
      if (end.retry_after_ms.has_value()) {
        context_->AddTrailingMetadata(kRetryAfterMsKey,
                                      std::to_string(*end.retry_after_ms));
      }
      final_status_ = ToGrpcStatus(end.status);
      if (writing_) return;  // OnWriteDone finishes after the last write
      finish_called_ = true;
    }
    ServerWriteReactor::Finish(final_status_);
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) {
        client_gone_ = true;
        queue_.clear();
      }
      if (!queue_.empty()) {
        next = &queue_.front();
      } else {
        writing_ = false;
        if (!finishing_ || finish_called_) return;
        finish_called_ = true;
      }
    }
    if (next != nullptr) {
      StartWrite(next);
    } else {
      ServerWriteReactor::Finish(final_status_);
    }
  }

  void OnCancel() override {
    std::shared_ptr<RequestHandle> handle;
    {
      absl::MutexLock lock(&mu_);
      client_gone_ = true;
      handle = handle_;
    }
    if (handle != nullptr) handle->Cancel();
  }

  void OnDone() override {
    std::shared_ptr<GenerateReactor> self;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      self = std::move(self_);
    }
    // `self` goes out of scope here: the pipeline may still hold the sink.
  }

 private:
  grpc::CallbackServerContext* const context_;
  absl::Mutex mu_;
  std::shared_ptr<GenerateReactor> self_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<RequestHandle> handle_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  // Written once under mu_ before finish_called_ is set; read after.
  grpc::Status final_status_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  auto reactor = std::make_shared<GenerateReactor>(context);
  GenerateReactor* raw = reactor.get();
  raw->Begin(std::move(reactor), core_, *request);
  return raw;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* reactor = context->DefaultReactor();
  v1::TokenizeRequest parsed;
  absl::Status status = ParseRawProto(*request, &parsed);
  if (status.ok()) {
    auto result = core_->Tokenize(parsed);
    if (result.ok()) {
      *response = SerializeToByteBuffer(*result);
    } else {
      status = result.status();
    }
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(
    grpc::CallbackServerContext* context, const v1::GetModelInfoRequest*,
    v1::GetModelInfoResponse* response) {
  auto* reactor = context->DefaultReactor();
  *response = core_->ModelInfo();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace pdserve
