#include "common/transport/kv_transports.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/logging.h"

namespace pdserve::transport {

absl::StatusOr<KvTransportMode> ParseKvTransportMode(absl::string_view name) {
  if (name == "auto") return KvTransportMode::kAuto;
  if (name == "ucx") return KvTransportMode::kUcx;
  if (name == "shm") {
    return absl::InvalidArgumentError(
        "--kv_transport=shm is gone: UCX moves KV through shared memory on "
        "one host (--kv_transport=ucx or auto)");
  }
  if (name == "grpc") return KvTransportMode::kGrpc;
  return absl::InvalidArgumentError(absl::StrCat(
      "--kv_transport must be auto, ucx or grpc, not '", name, "'"));
}

namespace {

// UCX for `mode`: required (ucx), optional (auto: a failure is logged), or
// not wanted (null).
absl::StatusOr<std::unique_ptr<UcxWorker>> MaybeUcx(KvTransportMode mode) {
  if (mode != KvTransportMode::kAuto && mode != KvTransportMode::kUcx) {
    return nullptr;
  }
  auto worker = UcxWorker::Create();
  if (worker.ok()) return worker;
  if (mode == KvTransportMode::kUcx) return worker.status();
  PDSERVE_LOG_WARNING("no UCX KV transport (%s); KV moves another way",
                      worker.status().ToString());
  return nullptr;
}

UcxStats StatsOf(const UcxWorker* worker, int64_t transfers,
                 int64_t mapped_buffers = 0) {
  UcxStats s;
  if (worker == nullptr) return s;
  const UcxCounters& c = worker->counters();
  s.endpoints = c.endpoints.load();
  s.registered_bytes = c.registered_bytes.load();
  s.endpoint_errors = c.endpoint_errors.load();
  s.operations = c.ops_in_flight.load() - c.ops_abandoned.load();
  s.transfers = transfers;
  s.mapped_buffers = mapped_buffers;
  return s;
}

}  // namespace

void FillUcxStatus(const UcxStats& stats, pb::WorkerStatusResponse* r) {
  r->set_kv_ucx_endpoints(stats.endpoints);
  r->set_kv_ucx_transfers(stats.transfers);
  r->set_kv_ucx_registered_bytes(stats.registered_bytes);
  r->set_kv_ucx_endpoint_errors(stats.endpoint_errors);
  r->set_kv_ucx_operations(stats.operations);
  r->set_kv_ucx_mapped_buffers(stats.mapped_buffers);
}

UcxStats KvSendTransports::ucx_stats() const {
  return StatsOf(worker_.get(), ucx_ != nullptr ? ucx_->pushes_in_flight() : 0);
}

UcxStats KvReceiveTransports::ucx_stats() const {
  if (ucx_ == nullptr) return StatsOf(worker_.get(), 0);
  return StatsOf(worker_.get(), ucx_->active(), ucx_->mapped_buffers());
}

absl::StatusOr<std::unique_ptr<KvSendTransports>> KvSendTransports::Create(
    KvTransportMode mode, std::shared_ptr<grpc::ChannelCredentials> creds,
    KvFaultInjection faults) {
  std::unique_ptr<KvSendTransports> t(new KvSendTransports());
  t->grpc_ = std::make_unique<GrpcKvSender>(std::move(creds), faults);
  t->sender_ = t->grpc_.get();
  auto worker = MaybeUcx(mode);
  if (!worker.ok()) return worker.status();
  if (*worker != nullptr) {
    t->worker_ = *std::move(worker);
    t->ucx_ = std::make_unique<UcxKvSender>(
        t->grpc_.get(), t->worker_.get(),
        mode == KvTransportMode::kAuto ? t->sender_ : nullptr);
    t->sender_ = t->ucx_.get();
  }
  return t;
}

KvSendTransports::~KvSendTransports() {
  // Senders before the worker that registered their regions.
  ucx_.reset();
  worker_.reset();
}

absl::StatusOr<std::unique_ptr<KvReceiveTransports>>
KvReceiveTransports::Create(KvTransportMode mode, int64_t max_chunk_bytes) {
  std::unique_ptr<KvReceiveTransports> t(new KvReceiveTransports());
  t->mode_ = mode;
  auto worker = MaybeUcx(mode);
  if (!worker.ok()) return worker.status();
  if (*worker != nullptr) {
    t->worker_ = *std::move(worker);
    t->ucx_ =
        std::make_unique<UcxKvReceiver>(t->worker_.get(), max_chunk_bytes);
  }
  return t;
}

KvReceiveTransports::~KvReceiveTransports() {
  ucx_.reset();
  worker_.reset();
}

KvReceiveOptions KvReceiveTransports::options() const {
  KvReceiveOptions o;
  o.ucx = ucx_.get();
  return o;
}

}  // namespace pdserve::transport
