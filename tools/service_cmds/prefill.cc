// `pdserve prefill`: one prefill worker.
#include <cstdio>

#include "absl/flags/flag.h"
#include "common/metrics/worker_metrics.h"
#include "common/transport/kv_transports.h"
#include "common/util/logging.h"
#include "common/util/malloc_tuning.h"
#include "common/util/signals.h"
#include "prefill_worker/prefill_worker.h"
#include "tools/common_flags.h"
#include "tools/service_cmds/kv_transport_flags.h"
#include "tools/service_cmds/service_common.h"
#include "tools/subcommand.h"

ABSL_FLAG(
    int32_t, max_prefill_tokens, 2048,
    "prefill: tokens per forward pass (prompts batched up to this; longer "
    "prompts are chunked)");
ABSL_FLAG(int32_t, max_prefill_queue, 256,
          "prefill: prompts queued at most; beyond, RESOURCE_EXHAUSTED (the "
          "router tries another worker) (0 = unbounded)");
ABSL_FLAG(
    int32_t, testonly_corrupt_kv_push, -1,
    "TEST ONLY fault injection: flip a byte of this KV chunk (0-based) of "
    "every push after its checksum (-1 = off)");
ABSL_FLAG(int32_t, testonly_stop_kv_push_after_chunks, -1,
          "TEST ONLY fault injection: send this many KV chunks of every push, "
          "then stall without committing (-1 = off)");
ABSL_FLAG(int32_t, testonly_prefill_delay_ms, 0,
          "TEST ONLY: sleep this many ms before each prefill batch (0 = off)");

namespace pdserve {
namespace {

int RunPrefill(const std::vector<std::string>&) {
  TuneMallocForLargeBuffers();  // KV chunks: reuse heap pages
  BlockTerminationSignals();
  SetLogRole("prefill");
  if (absl::Status s = CheckServiceFlags(); !s.ok()) {
    return FailWith("prefill", s);
  }
  auto metrics_server = StartMetricsFromFlags();
  if (!metrics_server.ok()) return FailWith("prefill", metrics_server.status());
  metrics::PrefillMetrics prefill_metrics((*metrics_server)->registry());
  auto engine = EngineOptionsFromFlags();
  if (!engine.ok()) return FailWith("prefill", engine.status());
  PrefillWorkerOptions options;
  options.engine = *engine;
  options.engine.max_batch_tokens = std::max(
      options.engine.max_batch_tokens, absl::GetFlag(FLAGS_max_prefill_tokens));
  options.max_batch_tokens = absl::GetFlag(FLAGS_max_prefill_tokens);
  options.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);
  options.max_queue = absl::GetFlag(FLAGS_max_prefill_queue);
  options.testonly_prefill_delay =
      absl::Milliseconds(absl::GetFlag(FLAGS_testonly_prefill_delay_ms));
  options.metrics = &prefill_metrics;
  auto channel_creds = InternalChannelCredentials();
  if (!channel_creds.ok()) return FailWith("prefill", channel_creds.status());
  transport::KvFaultInjection faults;
  faults.corrupt_chunk = absl::GetFlag(FLAGS_testonly_corrupt_kv_push);
  faults.stop_after_chunks =
      absl::GetFlag(FLAGS_testonly_stop_kv_push_after_chunks);
  if (faults.corrupt_chunk >= 0 || faults.stop_after_chunks >= 0) {
    PDSERVE_LOG_WARNING("TEST-ONLY KV push fault injection is ON");
  }
  auto kv_mode = KvTransportModeFromFlags();
  if (!kv_mode.ok()) return FailWith("prefill", kv_mode.status());
  auto kv =
      transport::KvSendTransports::Create(*kv_mode, *channel_creds, faults);
  if (!kv.ok()) return FailWith("prefill", kv.status());
  options.ucx_stats = [t = kv->get()] { return t->ucx_stats(); };
  auto worker = PrefillWorker::Create(options, (*kv)->sender());
  if (!worker.ok()) return FailWith("prefill", worker.status());
  auto creds = InternalServerCredentials();
  if (!creds.ok()) return FailWith("prefill", creds.status());
  ServerOptions so;
  so.address = ListenAddress(50052);
  so.creds = *creds;
  so.services = (*worker)->services();
  auto server = StartServer(so);
  if (!server.ok()) return FailWith("prefill", server.status());
  PrefillWorker* w = worker->get();
  int rc = ServeUntilTerminated(*server->server, server->port, "prefill",
                                {.start_draining = [w] { w->StartDraining(); },
                                 .active = [w] { return w->active_work(); }});
  server->server.reset();
  worker->reset();
  ReleaseMetricsServerAtExit(*std::move(metrics_server));
  return rc;
}

PDSERVE_SUBCOMMAND(
    "prefill", "run a prefill worker (gRPC)",
    "pdserve prefill [--port=50052] [--model=DIR] [--internal_ca=... "
    "--internal_cert=... --internal_key=...]",
    FlagNames({EngineFlagNames(),
               ServerFlagNames(),
               {"prefill_chunk_tokens", "kv_transport"}}),
    RunPrefill);

}  // namespace
}  // namespace pdserve
