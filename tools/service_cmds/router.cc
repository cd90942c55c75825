// `pdserve router`: the public Generation service in front of the workers.
#include <sys/resource.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/chat_template/chat_template.h"
#include "common/metrics/router_metrics.h"
#include "common/util/logging.h"
#include "common/util/signals.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "router/generation_service.h"
#include "router/http/http_server.h"
#include "router/http/openai_api.h"
#include "router/worker_pool.h"
#include "tools/common_flags.h"
#include "tools/service_cmds/service_common.h"
#include "tools/subcommand.h"

ABSL_FLAG(
    std::vector<std::string>, prefill_workers, {},
    "router: prefill workers, host:port or dns:///name:port (re-resolved)");
ABSL_FLAG(
    std::vector<std::string>, decode_workers, {},
    "router: decode workers, host:port or dns:///name:port (re-resolved)");
ABSL_FLAG(int32_t, auto_prefill_threshold, 32,
          "router --mode=auto: until the workers have measured their "
          "prefill throughput, prompts shorter than this many tokens are "
          "prefilled on the decode worker");
ABSL_FLAG(double, auto_stall_weight, 1.0,
          "router --mode=auto: weight of the decode stall a prefill on the "
          "decode worker causes to each of its running sequences, against "
          "the new request's time to first token");
ABSL_FLAG(bool, colocated_fallback, true,
          "when no prefill worker is routable (down or unreachable, or each "
          "refused the request as full or its KV pool as too small for the "
          "prompt), let the decode worker prefill the request itself instead "
          "of failing it (same output either way)");
ABSL_FLAG(absl::Duration, worker_wait, absl::Seconds(10),
          "router: when a pool has no healthy worker at all (its workers "
          "restarting), a request waits this long in all for one (never "
          "past its deadline) before UNAVAILABLE; 0 = fail at once");
ABSL_FLAG(int32_t, max_migrations, 2,
          "router: times a stream may move to another worker pair after its "
          "decode worker failed mid-stream (0 = never: the client gets "
          "UNAVAILABLE)");
ABSL_FLAG(int32_t, prefix_routing_blocks, 2,
          "router: route prompts sharing their first N KV blocks (of "
          "--block_size tokens) to the same prefill worker (0 = off)");
ABSL_FLAG(double, prefix_routing_max_extra_load, 2.0,
          "router: leave the prefix's prefill worker when its queue exceeds "
          "the least loaded one's by more than this");
ABSL_FLAG(int32_t, max_in_flight, 1024,
          "router: requests running at most (0 = unbounded), and never more "
          "than the healthy workers hold (their --max_prefill_queue; "
          "--max_num_seqs + --max_waiting_seqs); beyond, a request waits in "
          "the admission queue");
ABSL_FLAG(int32_t, admission_queue, 4096,
          "router: requests waiting for admission at most; beyond, "
          "RESOURCE_EXHAUSTED with a retry-after-ms hint");
ABSL_FLAG(absl::Duration, admission_timeout, absl::Seconds(30),
          "router: longest wait for admission (never past the request's own "
          "deadline) before RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, retry_after_ms, 100,
          "router: the retry-after-ms hint sent with RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_attempts, 3,
          "router: tries per request on UNAVAILABLE/RESOURCE_EXHAUSTED before "
          "any token was sent (a worker whose whole KV pool is too small, "
          "OUT_OF_RANGE, is skipped without using one)");
ABSL_FLAG(int32_t, default_max_tokens, 256, "router: max_tokens when unset");
ABSL_FLAG(int32_t, max_tokens_cap, 4096, "router: largest max_tokens accepted");
ABSL_FLAG(int32_t, max_prompt_tokens, 32768, "router: longest prompt accepted");
ABSL_FLAG(int32_t, max_stop_strings, 16,
          "router: most stop strings per request");
ABSL_FLAG(int32_t, max_request_bytes, 1 << 20,
          "router: largest serialized request accepted");
ABSL_FLAG(int32_t, worker_poll_ms, 200,
          "router: health check + status poll interval per worker");
ABSL_FLAG(int32_t, dns_refresh_seconds, 5,
          "router: re-resolve dns:/// workers");
ABSL_FLAG(int32_t, http_port, 8000,
          "router: port of the OpenAI-compatible HTTP API on --host (0 = off, "
          "-1 = any free port, written to --port_file as \"http=PORT\")");
ABSL_FLAG(std::string, served_model_name, "",
          "router: the model name of the HTTP API (GET /v1/models, the "
          "`model` field); default: the --model directory's name");
ABSL_FLAG(int64_t, http_max_body_bytes, 8 << 20,
          "router: largest HTTP request body (beyond: 413)");
ABSL_FLAG(int32_t, http_threads, 2,
          "router: threads serving every HTTP connection (asynchronous: not "
          "one per connection)");
ABSL_FLAG(int32_t, http_max_connections, 20000,
          "router: most HTTP connections open at once (beyond: a new one is "
          "closed at once); lowered to fit the open-file limit");
ABSL_FLAG(absl::Duration, http_idle_timeout, absl::Seconds(60),
          "router: close an HTTP keep-alive connection idle this long");
ABSL_FLAG(absl::Duration, http_request_timeout, absl::Seconds(30),
          "router: the longest time to receive one HTTP request (header and "
          "body; slow clients are cut off)");

namespace pdserve {
namespace {

// Many concurrent HTTP streams need many descriptors: raise the soft limit
// to the hard one (the default soft limit, 1024, is a few hundred streams).
void RaiseFileDescriptorLimit() {
  rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// The served model's name: --served_model_name, else the last component of
// the --model path ("models/stories260K" -> "stories260K").
std::string ServedModelName(const std::string& model_path) {
  std::string name = absl::GetFlag(FLAGS_served_model_name);
  if (!name.empty()) return name;
  std::string path = model_path;
  while (!path.empty() && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

int RunRouter(const std::vector<std::string>&) {
  BlockTerminationSignals();
  SetLogRole("router");
  if (absl::Status s = CheckServiceFlags(); !s.ok()) {
    return FailWith("router", s);
  }
  RaiseFileDescriptorLimit();
  if (absl::Status s =
          CheckPortFlag("http_port", absl::GetFlag(FLAGS_http_port));
      !s.ok()) {
    return FailWith("router", s);
  }
  auto metrics_server = StartMetricsFromFlags();
  if (!metrics_server.ok()) return FailWith("router", metrics_server.status());
  metrics::RouterMetrics router_metrics((*metrics_server)->registry());
  RouterOptions options;
  auto mode = ParseRouterMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return FailWith("router", mode.status());
  options.mode = *mode;
  options.auto_prefill_threshold = absl::GetFlag(FLAGS_auto_prefill_threshold);
  options.auto_stall_weight = absl::GetFlag(FLAGS_auto_stall_weight);
  options.colocated_fallback = absl::GetFlag(FLAGS_colocated_fallback);
  options.worker_wait = absl::GetFlag(FLAGS_worker_wait);
  options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  options.max_migrations = absl::GetFlag(FLAGS_max_migrations);
  options.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  options.admission_queue = absl::GetFlag(FLAGS_admission_queue);
  options.admission_timeout = absl::GetFlag(FLAGS_admission_timeout);
  options.retry_after_ms = absl::GetFlag(FLAGS_retry_after_ms);
  options.prefix_routing_blocks = absl::GetFlag(FLAGS_prefix_routing_blocks);
  options.kv_block_size = absl::GetFlag(FLAGS_block_size);
  options.prefix_routing_max_extra_load =
      absl::GetFlag(FLAGS_prefix_routing_max_extra_load);
  options.limits.default_max_tokens = absl::GetFlag(FLAGS_default_max_tokens);
  options.limits.max_tokens_cap = absl::GetFlag(FLAGS_max_tokens_cap);
  options.limits.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  options.limits.max_stop_strings = absl::GetFlag(FLAGS_max_stop_strings);
  options.limits.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  if (absl::Status s = CheckRouterOptions(options); !s.ok()) {
    return FailWith("router", s);
  }
  // The worker pools' and the HTTP server's settings.
  for (const auto& [ok, what] :
       std::initializer_list<std::pair<bool, const char*>>{
           {absl::GetFlag(FLAGS_worker_poll_ms) >= 1,
            "--worker_poll_ms must be >= 1"},
           {absl::GetFlag(FLAGS_dns_refresh_seconds) >= 1,
            "--dns_refresh_seconds must be >= 1"},
           {absl::GetFlag(FLAGS_http_threads) >= 1 &&
                absl::GetFlag(FLAGS_http_threads) <= 1024,
            "--http_threads must be 1 to 1024"},
           {absl::GetFlag(FLAGS_http_max_connections) >= 1,
            "--http_max_connections must be >= 1"},
           {absl::GetFlag(FLAGS_http_max_body_bytes) >= 1,
            "--http_max_body_bytes must be >= 1"},
           {absl::GetFlag(FLAGS_http_request_timeout) > absl::ZeroDuration(),
            "--http_request_timeout must be positive"},
           {absl::GetFlag(FLAGS_http_idle_timeout) > absl::ZeroDuration(),
            "--http_idle_timeout must be positive"}}) {
    if (!ok) return FailWith("router", absl::InvalidArgumentError(what));
  }

  const std::string model_path = absl::GetFlag(FLAGS_model);
  auto model = LoadRouterModelInfo(model_path);
  if (!model.ok()) return FailWith("router", model.status());
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tok_path = absl::GetFlag(FLAGS_tokenizer);
  if (tok_path.empty() && model_path.rfind("synthetic:", 0) != 0)
    tok_path = model_path;
  if (!tok_path.empty()) {
    auto tok = Tokenizer::Load(tok_path);
    if (!tok.ok()) return FailWith("router", tok.status());
    tokenizer = *std::move(tok);
  } else {
    PDSERVE_LOG_WARNING("no tokenizer: only token-id prompts are accepted");
  }
  // The chat template: a template that does not parse (or a missing
  // --chat_template file) stops the router here; a model without one only
  // makes chat requests fail with the reason.
  const bool synthetic = model_path.rfind("synthetic:", 0) == 0;
  absl::StatusOr<ModelChatTemplates> chat_templates = ModelChatTemplates::Load(
      synthetic ? "" : model_path, absl::GetFlag(FLAGS_chat_template));
  if (!chat_templates.ok() &&
      !absl::IsFailedPrecondition(chat_templates.status())) {
    return FailWith("router", chat_templates.status());
  }
  if (!chat_templates.ok()) {
    PDSERVE_LOG_INFO("chat requests will be refused: %s",
                     chat_templates.status().message());
  }
  if (options.mode != RouterMode::kColocated &&
      absl::GetFlag(FLAGS_prefill_workers).empty()) {
    return FailWith(
        "router", absl::InvalidArgumentError(
                      "--prefill_workers is required unless --mode=colocated"));
  }
  if (absl::GetFlag(FLAGS_decode_workers).empty()) {
    return FailWith("router",
                    absl::InvalidArgumentError("--decode_workers is required"));
  }
  for (absl::Status s :
       {CheckWorkerTargets("prefill_workers",
                           absl::GetFlag(FLAGS_prefill_workers)),
        CheckWorkerTargets("decode_workers",
                           absl::GetFlag(FLAGS_decode_workers))}) {
    if (!s.ok()) return FailWith("router", s);
  }
  auto channel_creds = InternalChannelCredentials();
  if (!channel_creds.ok()) return FailWith("router", channel_creds.status());
  WorkerPoolOptions popts;
  popts.creds = *channel_creds;
  popts.poll_interval = absl::Milliseconds(absl::GetFlag(FLAGS_worker_poll_ms));
  popts.dns_refresh = absl::Seconds(absl::GetFlag(FLAGS_dns_refresh_seconds));
  popts.metrics = &router_metrics;
  popts.kind = PoolKind::kPrefill;
  popts.targets = absl::GetFlag(FLAGS_prefill_workers);
  WorkerPool prefill(popts);
  popts.kind = PoolKind::kDecode;
  popts.targets = absl::GetFlag(FLAGS_decode_workers);
  WorkerPool decode(popts);
  GenerationCore core(options, *model, std::move(tokenizer),
                      std::move(chat_templates), &prefill, &decode,
                      &router_metrics);
  GenerationService service(&core);

  TlsFiles public_tls;
  public_tls.cert = absl::GetFlag(FLAGS_tls_cert);
  public_tls.key = absl::GetFlag(FLAGS_tls_key);
  auto creds = MakeServerCredentials(public_tls, /*require_client_cert=*/false);
  if (!creds.ok()) return FailWith("router", creds.status());
  ServerOptions so;
  so.address = ListenAddress(50051);
  so.creds = *creds;
  // Requests up to 4x the limit reach validation (a clear INVALID_ARGUMENT);
  // larger ones are refused by gRPC itself (RESOURCE_EXHAUSTED).
  so.max_receive_bytes = 4 * options.limits.max_request_bytes + 4096;
  so.reflection = true;
  so.services = {&service};
  auto server = StartServer(so);
  if (!server.ok()) return FailWith("router", server.status());

  // The OpenAI-compatible HTTP API: another front door to the same core.
  openai::ApiOptions api_options;
  api_options.served_model_name = ServedModelName(model_path);
  api_options.created = absl::ToUnixSeconds(absl::Now());
  api_options.metrics_text = [registry = &(*metrics_server)->registry()] {
    return prometheus::TextSerializer().Serialize(registry->Collect());
  };
  openai::OpenAiApi api(&core, &router_metrics, api_options);
  std::unique_ptr<http::Server> http_server;
  if (const int http_port = absl::GetFlag(FLAGS_http_port); http_port != 0) {
    http::ServerOptions ho;
    ho.host = absl::GetFlag(FLAGS_host);
    ho.port = http_port < 0 ? 0 : http_port;
    ho.threads = absl::GetFlag(FLAGS_http_threads);
    ho.max_body_bytes =
        static_cast<size_t>(absl::GetFlag(FLAGS_http_max_body_bytes));
    ho.max_connections =
        static_cast<size_t>(absl::GetFlag(FLAGS_http_max_connections));
    ho.idle_timeout = absl::GetFlag(FLAGS_http_idle_timeout);
    ho.request_timeout = absl::GetFlag(FLAGS_http_request_timeout);
    auto started = http::Server::Start(
        ho, [&api](http::Request request, std::shared_ptr<http::Responder> r) {
          api.Handle(std::move(request), std::move(r));
        });
    if (!started.ok()) return FailWith("router", started.status());
    http_server = *std::move(started);
    AnnounceHttpPort(http_server->port());
    std::printf("pdserve router HTTP (OpenAI API) on http://%s:%d/v1\n",
                ho.host.c_str(), http_server->port());
  }
  GenerationCore* c = &core;
  http::Server* h = http_server.get();
  DrainHooks hooks;
  hooks.start_draining = [c, h] {
    c->StartDraining();
    if (h != nullptr) h->StartDraining();
  };
  hooks.active = [c, h] {
    return c->in_flight() + (h != nullptr ? h->active_requests() : 0);
  };
  hooks.stop_in_flight = [c](const absl::Status& why) { c->StopRunning(why); };
  hooks.describe_active = [c, h] {
    // An HTTP generation is both a generation and an HTTP request.
    std::string what =
        absl::StrCat(c->in_flight(), " generations (gRPC and HTTP)");
    if (h != nullptr) {
      absl::StrAppend(&what, ", ", h->active_requests(), " HTTP requests");
    }
    return what;
  };
  const int rc =
      ServeUntilTerminated(*server->server, server->port, "router", hooks);
  if (http_server != nullptr) http_server->Stop();
  ReleaseMetricsServerAtExit(*std::move(metrics_server));
  return rc;
}

PDSERVE_SUBCOMMAND(
    "router", "run the router (public Generation API, gRPC)",
    "pdserve router --prefill_workers=h:p,... --decode_workers=h:p,... "
    "[--port=50051] [--http_port=8000] [--mode=disaggregated|colocated|auto] "
    "[--chat_template=FILE] [--tls_cert --tls_key]",
    FlagNames({ServerFlagNames(),
               {"model", "tokenizer", "block_size", "chat_template", "mode",
                "tls_cert", "tls_key"}}),
    RunRouter);

}  // namespace
}  // namespace pdserve
