#include "router/generation_service.h"

#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_util/grpc_util.h"

namespace pdserve {

namespace v1 = ::pdserve::v1;

namespace {

// One Generate call: the reactor gRPC drives and the ResponseSink the
// pipeline writes to. It owns itself (self_) until gRPC's OnDone; the
// pipeline holds it through the sink's shared_ptr, and after OnDone its
// writes are refused.
class GenerateReactor final
    : public grpc::ServerWriteReactor<v1::GenerateResponse>,
      public ResponseSink {
 public:
  explicit GenerateReactor(grpc::CallbackServerContext* context)
      : context_(context) {}

  void Begin(std::shared_ptr<GenerateReactor> self, GenerationCore* core,
             const v1::GenerateRequest& request) {
    self_ = self;
    handle_ = core->Generate(request, absl::FromChrono(context_->deadline()),
                             std::move(self));
  }

  // gRPC may run reactions on the thread that starts an operation, so the
  // lock is never held across StartWrite or Finish.
  bool Write(const v1::GenerateResponse& msg) override {
    const v1::GenerateResponse* start = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (done_ || client_gone_ || finishing_) return false;
      queue_.push_back(msg);  // deque: the front's address stays valid
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
    const v1::GenerateResponse* next = nullptr;
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
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  // Written once under mu_ before finish_called_ is set; read after.
  grpc::Status final_status_;
};

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto reactor = std::make_shared<GenerateReactor>(context);
  GenerateReactor* raw = reactor.get();
  raw->Begin(std::move(reactor), core_, *request);
  return raw;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(
    grpc::CallbackServerContext* context, const v1::TokenizeRequest* request,
    v1::TokenizeResponse* response) {
  auto* reactor = context->DefaultReactor();
  auto result = core_->Tokenize(*request);
  if (result.ok()) *response = *std::move(result);
  reactor->Finish(ToGrpcStatus(result.status()));
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
