// DecodeWorker: one decode process. Owns the Engine, its continuous-batching
// GenerationScheduler, the KvLeaseTable that receives KV pushes, and the gRPC
// services (Decode, KvTransfer, Worker). A Decode call claims a pushed
// sequence (or, colocated, prefills the prompt itself), admits it into the
// batch, streams its tokens and measures its decode-side stage timings.
// Exports DecodeMetrics. Thread-safe: gRPC handler threads call in.
#ifndef PDSERVE_DECODE_WORKER_DECODE_WORKER_H_
#define PDSERVE_DECODE_WORKER_DECODE_WORKER_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "common/engine/scheduler.h"
#include "common/metrics/worker_metrics.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_transports.h"
#include "common/util/cost_fit.h"
#include "decode_worker/kv_lease_table.h"
#include "pdserve/v1/worker.grpc.pb.h"

namespace pdserve {

struct DecodeWorkerOptions {
  EngineOptions engine;
  SchedulerOptions scheduler;
  absl::Duration kv_lease = absl::Seconds(5);
  // Which KV transports pushes may use (--kv_transport): auto and ucx start
  // a UCX worker.
  transport::KvTransportMode kv_transport = transport::KvTransportMode::kAuto;
  // Test-only: one token per message, this long apart (slow streams for
  // failure tests). Zero = off.
  absl::Duration testonly_stream_delay;
  bool testonly_hide_kv_pool_size = false;  // Status reports no block size
  // Required; must outlive the worker.
  metrics::DecodeMetrics* metrics = nullptr;
};

class DecodeWorker final : public pb::Decode::Service,
                           public pb::Worker::Service {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeWorker>> Create(
      const DecodeWorkerOptions& options);
  ~DecodeWorker() override;

  // Services to register on the server.
  std::vector<grpc::Service*> services();

  // Stop accepting new Decode calls (they get UNAVAILABLE).
  void StartDraining() { draining_.store(true); }
  // Decode streams still running.
  int active_streams() const { return active_streams_.load(); }

  grpc::Status Decode(grpc::ServerContext* context,
                      const pb::DecodeRequest* request,
                      grpc::ServerWriter<pb::DecodeResponse>* writer) override;
  grpc::Status Status(grpc::ServerContext* context,
                      const pb::WorkerStatusRequest* request,
                      pb::WorkerStatusResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context,
                     const pb::AbortRequest* request,
                     pb::AbortResponse* response) override;

 private:
  explicit DecodeWorker(const DecodeWorkerOptions& options);
  // Scheduler thread, after each step (the engine is idle): step histogram,
  // queue gauges, KV pool, preemptions and prefix-cache counters.
  void OnStep(double seconds);
  // Queue gauges and KV pool from any thread (Status polls keep them fresh
  // while no step runs).
  void ExportGauges(int64_t free_blocks, int64_t total_blocks);
  int64_t KvBytesPerToken() const;  // KV bytes of one token, all layers

  const DecodeWorkerOptions options_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<GenerationScheduler> scheduler_;
  std::unique_ptr<KvLeaseTable> leases_;
  std::unique_ptr<transport::KvReceiveTransports> kv_transports_;
  std::unique_ptr<transport::KvTransferService> kv_service_;

  std::atomic<bool> draining_{false};
  std::atomic<int> active_streams_{0};
  std::atomic<int64_t> prefill_tokens_{0};
  std::atomic<int64_t> tokens_generated_{0};
  // Measurements for the router's --mode=auto policy: colocated prompt
  // tokens not yet prefilled, colocated prefill seconds against prompt
  // tokens, and KV push bytes / push seconds.
  std::atomic<int64_t> queued_prefill_tokens_{0};
  CostFit prefill_cost_;
  Ewma kv_receive_rate_;
  std::atomic<int64_t> completed_{0};
  std::atomic<int64_t> cancelled_{0};

  // Scheduler counters at the previous OnStep (scheduler thread only).
  SchedulerStats last_stats_;

  // Running Decode streams by request id (for Abort).
  absl::Mutex mu_;
  std::map<std::string, GenerationScheduler::RequestId> active_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pdserve

#endif  // PDSERVE_DECODE_WORKER_DECODE_WORKER_H_
