// OpenAiApi: the router's OpenAI-compatible HTTP API (/v1/chat/completions,
// /v1/completions, /v1/models[/ID], /health, /tokenize, /detokenize,
// /metrics; docs/openai.md). Each generation request becomes GenerateRequests
// run by the same GenerationCore as gRPC (so validation, routing, retries,
// migration, cancellation, metrics and stage timings are shared) and its token
// stream is turned into one JSON response or server-sent events. A client that
// disconnects cancels its requests. Thread-safe.
#ifndef PDSERVE_ROUTER_HTTP_OPENAI_API_H_
#define PDSERVE_ROUTER_HTTP_OPENAI_API_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/metrics/router_metrics.h"
#include "nlohmann/json.hpp"
#include "router/generation_core.h"
#include "router/http/http_server.h"

namespace pdserve::openai {

struct ApiOptions {
  std::string served_model_name;  // the `model` clients send (GET /v1/models)
  int64_t created = 0;            // unix seconds shown for the model
  // GET /metrics: the router's metrics in Prometheus text format, as on its
  // metrics port (vLLM serves them on its API port too). Empty: 404.
  std::function<std::string()> metrics_text;
};

class OpenAiApi {
 public:
  // `core` and `metrics` must outlive this.
  OpenAiApi(GenerationCore* core, metrics::RouterMetrics* metrics,
            ApiOptions options);

  // The http::Handler of the router's HTTP server.
  void Handle(http::Request request,
              std::shared_ptr<http::Responder> responder);

  const ApiOptions& options() const { return options_; }
  GenerationCore* core() const { return core_; }
  metrics::RouterMetrics* metrics() const { return metrics_; }

 private:
  void Models(const http::Request& request, http::Responder& responder);
  // GET /v1/models/{id} (the SDK's models.retrieve): the served model, or
  // 404 model_not_found.
  void Model(const std::string& id, http::Responder& responder);
  nlohmann::json ModelJson() const;  // one entry of /v1/models
  // 404 model_not_found for a `model` this server does not serve.
  void SendUnknownModel(http::Responder& responder,
                        const std::string& model) const;
  void Health(http::Responder& responder);
  void Tokenize(const http::Request& request, http::Responder& responder);
  void Detokenize(const http::Request& request, http::Responder& responder);
  void Generate(const http::Request& request,
                std::shared_ptr<http::Responder> responder, bool chat);

  GenerationCore* const core_;
  metrics::RouterMetrics* const metrics_;
  const ApiOptions options_;
};

}  // namespace pdserve::openai

#endif  // PDSERVE_ROUTER_HTTP_OPENAI_API_H_
