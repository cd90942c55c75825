// `pdserve decode`: one decode worker.
#include <cstdio>

#include "absl/flags/flag.h"
#include "common/metrics/worker_metrics.h"
#include "common/util/logging.h"
#include "common/util/malloc_tuning.h"
#include "common/util/signals.h"
#include "decode_worker/decode_worker.h"
#include "tools/common_flags.h"
#include "tools/service_cmds/kv_transport_flags.h"
#include "tools/service_cmds/service_common.h"
#include "tools/subcommand.h"

ABSL_FLAG(
    double, kv_lease_seconds, 5.0,
    "decode: KV of a push that stalls, or that no router claims, is freed "
    "after this long");

ABSL_FLAG(int32_t, max_waiting_seqs, 256,
          "decode: sequences waiting to join the batch at most, beyond "
          "its free slots: the worker holds --max_num_seqs + this many; "
          "beyond, RESOURCE_EXHAUSTED (0 = unbounded). A sequence whose KV "
          "was pushed already is never refused for it");
ABSL_FLAG(double, kv_watermark, 0.01,
          "decode: admit new sequences only while this fraction of the KV "
          "blocks stays free (running sequences grow into it)");

ABSL_FLAG(
    int32_t, testonly_stream_delay_ms, 0,
    "TEST ONLY: stream one token per message, this many ms apart (0 = off)");
ABSL_FLAG(bool, testonly_hide_kv_pool_size, false,
          "TEST ONLY: report no kv_block_size in Worker.Status, as a worker "
          "from before it did (the router then learns the pool's size from "
          "refusals)");

namespace pdserve {
namespace {

int RunDecode(const std::vector<std::string>&) {
  TuneMallocForLargeBuffers();  // KV chunks: reuse heap pages
  BlockTerminationSignals();
  SetLogRole("decode");
  if (absl::Status s = CheckServiceFlags(); !s.ok()) {
    return FailWith("decode", s);
  }
  auto metrics_server = StartMetricsFromFlags();
  if (!metrics_server.ok()) return FailWith("decode", metrics_server.status());
  metrics::DecodeMetrics decode_metrics((*metrics_server)->registry());
  auto engine = EngineOptionsFromFlags();
  if (!engine.ok()) return FailWith("decode", engine.status());
  DecodeWorkerOptions options;
  options.engine = *engine;
  options.scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  options.scheduler.prefill_chunk_tokens =
      absl::GetFlag(FLAGS_prefill_chunk_tokens);
  options.scheduler.max_waiting = absl::GetFlag(FLAGS_max_waiting_seqs);
  options.scheduler.kv_watermark = absl::GetFlag(FLAGS_kv_watermark);
  options.kv_lease = absl::Seconds(absl::GetFlag(FLAGS_kv_lease_seconds));
  options.testonly_stream_delay =
      absl::Milliseconds(absl::GetFlag(FLAGS_testonly_stream_delay_ms));
  options.testonly_hide_kv_pool_size =
      absl::GetFlag(FLAGS_testonly_hide_kv_pool_size);
  options.metrics = &decode_metrics;
  auto kv_mode = KvTransportModeFromFlags();
  if (!kv_mode.ok()) return FailWith("decode", kv_mode.status());
  options.kv_transport = *kv_mode;
  auto worker = DecodeWorker::Create(options);
  if (!worker.ok()) return FailWith("decode", worker.status());
  auto creds = InternalServerCredentials();
  if (!creds.ok()) return FailWith("decode", creds.status());
  ServerOptions so;
  so.address = ListenAddress(50053);
  so.creds = *creds;
  so.services = (*worker)->services();
  auto server = StartServer(so);
  if (!server.ok()) return FailWith("decode", server.status());
  DecodeWorker* w = worker->get();
  int rc =
      ServeUntilTerminated(*server->server, server->port, "decode",
                           {.start_draining = [w] { w->StartDraining(); },
                            .active = [w] { return w->active_streams(); }});
  server->server.reset();
  worker->reset();
  ReleaseMetricsServerAtExit(*std::move(metrics_server));
  return rc;
}

PDSERVE_SUBCOMMAND("decode", "run a decode worker (gRPC)",
                   "pdserve decode [--port=50053] [--model=DIR] "
                   "[--kv_cache_memory=256MiB] [--kv_lease_seconds=5]",
                   FlagNames({EngineFlagNames(),
                              ServerFlagNames(),
                              {"max_num_seqs", "prefill_chunk_tokens",
                               "kv_transport"}}),
                   RunDecode);

}  // namespace
}  // namespace pdserve
