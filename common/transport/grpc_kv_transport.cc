#include "common/transport/grpc_kv_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/util/logging.h"
#include "grpcpp/client_context.h"

namespace pdserve::transport {
namespace {

// One push over a client-streaming call. Send/Commit run on one thread;
// Cancel may come from any thread (ClientContext::TryCancel is thread-safe).
class GrpcKvPushStream : public KvPushStream {
 public:
  GrpcKvPushStream(std::shared_ptr<grpc::Channel> channel,
                   const KvFaultInjection& faults, absl::Time deadline)
      : channel_(std::move(channel)),
        stub_(pb::KvTransfer::NewStub(channel_)),
        faults_(faults) {
    context_.set_deadline(absl::ToChronoTime(deadline));
  }
  ~GrpcKvPushStream() override {
    if (writer_ != nullptr && !finished_) {
      context_.TryCancel();
      (void)writer_->Finish();
    }
  }

  absl::Status Start(const pb::KvHeader& header) {
    writer_ = stub_->Push(&context_, &ack_);
    pb::KvPushMessage msg;
    *msg.mutable_header() = header;
    if (!writer_->Write(msg)) return FinishWithError();
    return absl::OkStatus();
  }

  absl::Status Send(pb::KvChunk chunk) override {
    if (!error_.ok()) return error_;
    const int index = chunks_sent_++;
    if (faults_.stop_after_chunks >= 0 && index >= faults_.stop_after_chunks) {
      stalled_ = true;  // test-only: the push never completes
      return absl::OkStatus();
    }
    if (index == faults_.corrupt_chunk && !chunk.data().empty()) {
      (*chunk.mutable_data())[chunk.data().size() / 2] ^= 0x5a;  // test-only
    }
    pb::KvPushMessage msg;
    *msg.mutable_chunk() = std::move(chunk);
    if (!writer_->Write(msg)) return FinishWithError();
    return absl::OkStatus();
  }

  absl::StatusOr<KvPushResult> Commit(const pb::KvCommit& commit) override {
    if (!error_.ok()) return error_;
    if (stalled_) {
      // Test-only stall: wait until the receiver gives up (lease expiry) or
      // the deadline passes.
      grpc::Status s = writer_->Finish();
      finished_ = true;
      error_ = s.ok() ? absl::AbortedError("stalled push was accepted")
                      : FromGrpcStatus(s);
      return error_;
    }
    pb::KvPushMessage msg;
    *msg.mutable_commit() = commit;
    writer_->WriteLast(msg, grpc::WriteOptions());
    grpc::Status s = writer_->Finish();
    finished_ = true;
    if (!s.ok()) {
      error_ = FromGrpcStatus(s);
      return error_;
    }
    return KvPushResult{ack_.bytes_received(), ack_.transfer_seconds()};
  }

  void Cancel() override { context_.TryCancel(); }

 private:
  absl::Status FinishWithError() {
    // A failed Write means the call is over: Finish gives D's status.
    grpc::Status s = writer_->Finish();
    finished_ = true;
    error_ = s.ok()
                 ? absl::UnavailableError("KV push stream closed by receiver")
                 : FromGrpcStatus(s);
    return error_;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KvTransfer::Stub> stub_;
  const KvFaultInjection faults_;
  grpc::ClientContext context_;
  pb::KvPushAck ack_;
  std::unique_ptr<grpc::ClientWriter<pb::KvPushMessage>> writer_;
  absl::Status error_;
  int chunks_sent_ = 0;
  bool stalled_ = false;
  bool finished_ = false;
};

}  // namespace

GrpcKvSender::GrpcKvSender(std::shared_ptr<grpc::ChannelCredentials> creds,
                           KvFaultInjection faults)
    : creds_(std::move(creds)), faults_(faults) {}

std::shared_ptr<grpc::Channel> GrpcKvSender::ChannelFor(
    const std::string& target) {
  absl::MutexLock lock(&mu_);
  auto& ch = channels_[target];
  if (ch == nullptr) ch = MakeChannel(target, creds_);
  return ch;
}

absl::StatusOr<std::unique_ptr<KvPushStream>> GrpcKvSender::Open(
    const std::string& target, const pb::KvHeader& header,
    absl::Time deadline) {
  auto stream =
      std::make_unique<GrpcKvPushStream>(ChannelFor(target), faults_, deadline);
  absl::Status s = stream->Start(header);
  if (!s.ok()) return s;
  return stream;
}

grpc::Status KvTransferService::Push(
    grpc::ServerContext* context, grpc::ServerReader<pb::KvPushMessage>* reader,
    pb::KvPushAck* ack) {
  const absl::Time start = absl::Now();
  pb::KvPushMessage msg;
  if (!reader->Read(&msg) || !msg.has_header()) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("KV push must start with a header"));
  }
  const pb::KvHeader& header = msg.header();
  absl::Status s = CheckHeaderCompatible(header, factory_->fingerprint(),
                                         factory_->layout());
  if (!s.ok()) {
    counters_.refused.fetch_add(1);
    PDSERVE_LOG_WARNING("refusing KV push %s: %s", header.request_id(),
                        s.ToString());
    factory_->Refused(header, s);
    return ToGrpcStatus(s);
  }
  auto sink = factory_->Begin(header, [context] { context->TryCancel(); });
  if (!sink.ok()) {
    counters_.refused.fetch_add(1);
    return ToGrpcStatus(sink.status());
  }
  counters_.pushes.fetch_add(1);
  KvCoverage coverage(factory_->layout(), header.num_tokens());
  auto fail = [&](absl::Status st) {
    (*sink)->OnAbort(st);
    return ToGrpcStatus(st);
  };
  while (true) {
    if (!reader->Read(&msg)) {
      return fail(context->IsCancelled()
                      ? absl::CancelledError("KV push cancelled")
                      : absl::UnavailableError(
                            "KV push ended before its commit (prefill worker "
                            "gone?)"));
    }
    if (msg.has_chunk()) {
      s = coverage.Accept(msg.chunk());
      if (absl::IsDataLoss(s)) {
        counters_.checksum_failures.fetch_add(1);
        (*sink)->OnChecksumFailure();
      }
      if (s.ok()) s = (*sink)->OnChunk(msg.chunk());
      if (!s.ok()) return fail(s);
      counters_.bytes.fetch_add(
          static_cast<int64_t>(msg.chunk().data().size()));
    } else if (msg.has_commit()) {
      if (!coverage.complete()) {
        return fail(absl::DataLossError(
            absl::StrCat("KV push committed with ", coverage.bytes(), " of ",
                         coverage.expected_bytes(), " bytes")));
      }
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      s = (*sink)->OnCommit(msg.commit(), seconds);
      if (!s.ok()) return fail(s);
      ack->set_bytes_received(coverage.bytes());
      ack->set_transfer_seconds(seconds);
      return grpc::Status::OK;
    } else {
      return fail(absl::InvalidArgumentError("KV push: second header"));
    }
  }
}

}  // namespace pdserve::transport
