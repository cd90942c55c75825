#include "common/transport/grpc_kv_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/util/logging.h"
#include "grpcpp/client_context.h"

namespace pdserve::transport {

KvPushCall::KvPushCall(const std::shared_ptr<grpc::Channel>& channel,
                       absl::Time deadline)
    : stub_(pb::KvTransfer::NewStub(channel)) {
  context_.set_deadline(absl::ToChronoTime(deadline));
  writer_ = stub_->Push(&context_, &ack_);
}

KvPushCall::~KvPushCall() {
  if (!finished_) {
    context_.TryCancel();
    (void)writer_->Finish();
  }
}

absl::Status KvPushCall::FinishWithError(absl::Status if_ok) {
  grpc::Status s = writer_->Finish();
  finished_ = true;
  error_ = s.ok() ? std::move(if_ok) : FromGrpcStatus(s);
  return error_;
}

absl::Status KvPushCall::Write(const pb::KvPushMessage& msg) {
  if (!error_.ok()) return error_;
  if (finished_) return absl::FailedPreconditionError("KV push call is over");
  if (!writer_->Write(msg)) {
    // A failed Write means the call is over: Finish gives D's status.
    return FinishWithError(
        absl::UnavailableError("KV push stream closed by receiver"));
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::KvPushAck> KvPushCall::Finish(
    const pb::KvPushMessage& last) {
  if (!error_.ok()) return error_;
  writer_->WriteLast(last, grpc::WriteOptions());
  absl::Status s = FinishWithError(absl::OkStatus());  // OK when D acknowledged
  if (!s.ok()) return s;
  return ack_;
}

absl::Status KvPushCall::FinishWithoutCommit() {
  if (!error_.ok()) return error_;
  return FinishWithError(absl::AbortedError("stalled push was accepted"));
}

namespace {

// One push over a client-streaming call, chunks inline. Send/Commit run on
// one thread; Cancel may come from any thread.
class GrpcKvPushStream : public KvPushStream {
 public:
  GrpcKvPushStream(const std::shared_ptr<grpc::Channel>& channel,
                   const KvFaultInjection& faults, absl::Time deadline)
      : call_(channel, deadline), faults_(faults) {}

  absl::Status Start(const pb::KvHeader& header) {
    pb::KvPushMessage msg;
    *msg.mutable_header() = header;
    return call_.Write(msg);
  }

  absl::Status Send(pb::KvChunk chunk) override {
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
    return call_.Write(msg);
  }

  absl::StatusOr<KvPushResult> Commit(const pb::KvCommit& commit) override {
    if (stalled_) {
      // Test-only stall: wait until the receiver gives up (lease expiry) or
      // the deadline passes.
      return call_.FinishWithoutCommit();
    }
    pb::KvPushMessage msg;
    *msg.mutable_commit() = commit;
    auto ack = call_.Finish(msg);
    if (!ack.ok()) return ack.status();
    return KvPushResult{ack->bytes_received(), ack->transfer_seconds(), "grpc"};
  }

  void Cancel() override { call_.Cancel(); }

 private:
  KvPushCall call_;
  const KvFaultInjection faults_;
  int chunks_sent_ = 0;
  bool stalled_ = false;
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

absl::StatusOr<pb::KvDescribeResponse> GrpcKvSender::Describe(
    const std::string& target, absl::Time deadline,
    const pb::KvDescribeRequest& request) {
  auto stub = pb::KvTransfer::NewStub(ChannelFor(target));
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(10))));
  pb::KvDescribeResponse response;
  grpc::Status s = stub->Describe(&context, request, &response);
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return pb::KvDescribeResponse();  // accepts inline pushes only
  }
  if (!s.ok()) return FromGrpcStatus(s);
  return response;
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

KvTransferService::KvTransferService(KvSinkFactory* factory,
                                     KvReceiveOptions options)
    : factory_(factory), ucx_(options.ucx) {}

grpc::Status KvTransferService::Describe(grpc::ServerContext*,
                                         const pb::KvDescribeRequest* request,
                                         pb::KvDescribeResponse* response) {
  if (ucx_ != nullptr) ucx_->Describe(*request, response);
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<KvChunkSource>> KvTransferService::OpenSource(
    const pb::KvHeader& header) {
  if (!header.has_ucx()) return nullptr;
  absl::StatusOr<std::unique_ptr<KvChunkSource>> source =
      ucx_ != nullptr ? ucx_->Open(header)
                      : absl::FailedPreconditionError(
                            "this decode worker accepts no UCX pushes");
  if (!source.ok()) counters_.ucx_unusable.fetch_add(1);
  return source;
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
  // A UCX push refused before it has a source: P may already have sent
  // chunks (UCX cannot cancel its sends), they are discarded here.
  auto abandon = [&] {
    if (header.has_ucx() && ucx_ != nullptr) ucx_->Abandon(header.ucx());
  };
  absl::Status s = CheckHeaderCompatible(header, factory_->fingerprint(),
                                         factory_->layout());
  if (!s.ok()) {
    counters_.refused.fetch_add(1);
    PDSERVE_LOG_WARNING("refusing KV push %s: %s", header.request_id(),
                        s.ToString());
    factory_->Refused(header, s);
    abandon();
    return ToGrpcStatus(s);
  }
  KvCoverage coverage(factory_->layout(), header.num_tokens());
  // UCX: a landing buffer, taken before any sink exists and returned when
  // this call ends.
  auto source = OpenSource(header);
  if (!source.ok()) {
    PDSERVE_LOG_WARNING("KV push %s: %s", header.request_id(),
                        source.status().ToString());
    abandon();
    return ToGrpcStatus(source.status());
  }
  auto sink = factory_->Begin(header, [context] { context->TryCancel(); });
  if (!sink.ok()) {
    counters_.refused.fetch_add(1);
    if (*source != nullptr) (*source)->Failed(sink.status());
    return ToGrpcStatus(sink.status());
  }
  counters_.pushes.fetch_add(1);
  if (header.has_ucx()) counters_.ucx_pushes.fetch_add(1);
  auto fail = [&](absl::Status st) {
    if (*source != nullptr) (*source)->Failed(st);
    (*sink)->OnAbort(st);
    return ToGrpcStatus(st);
  };
  auto cancelled = [context] { return context->IsCancelled(); };
  while (true) {
    if (!reader->Read(&msg)) {
      return fail(context->IsCancelled()
                      ? absl::CancelledError("KV push cancelled")
                      : absl::UnavailableError(
                            "KV push ended before its commit (prefill worker "
                            "gone?)"));
    }
    if (msg.has_chunk() || msg.has_chunk_ref()) {
      // Both kinds are verified and sunk by the same code; a referenced
      // chunk's bytes are in the landing buffer its UCX message filled. The
      // checksum guards against corruption, as on the wire, not against a
      // hostile P, which could send any bytes.
      absl::StatusOr<KvChunkView> chunk = absl::InvalidArgumentError(
          "KV push: chunk reference in a push without UCX");
      if (msg.has_chunk()) {
        chunk = KvChunkView::Of(msg.chunk());
      } else if (*source != nullptr) {
        chunk = (*source)->Fetch(msg.chunk_ref(), cancelled);
      }
      if (!chunk.ok()) return fail(chunk.status());
      // A sink that reads the bytes anyway (the import) hashes them on the
      // way: the checksum is compared right after, before the chunk counts.
      const bool sink_hashes = (*sink)->HashesChunks();
      s = coverage.Accept(*chunk, /*verify_checksum=*/!sink_hashes);
      if (s.ok()) {
        uint64_t xxh3 = 0;
        s = (*sink)->OnChunk(*chunk, sink_hashes ? &xxh3 : nullptr);
        if (s.ok() && sink_hashes) s = KvCoverage::VerifyChecksum(*chunk, xxh3);
      }
      // The sink has read the bytes: P may reuse a buffer D read in place.
      if (msg.has_chunk_ref()) (*source)->Consumed();
      if (absl::IsDataLoss(s)) {
        counters_.checksum_failures.fetch_add(1);
        (*sink)->OnChecksumFailure();
      }
      if (!s.ok()) return fail(s);
      counters_.bytes.fetch_add(static_cast<int64_t>(chunk->data.size()));
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
