#include "router/http/openai_api.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/util/version.h"
#include "router/http/openai_job.h"
#include "router/http/openai_request.h"
#include "router/http/openai_response.h"

namespace pdserve::openai {

namespace v1 = ::pdserve::v1;
using nlohmann::json;

namespace {

constexpr const char* kKnownPaths[] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models",
    "/v1/models/{model}",   "/health",         "/tokenize",
    "/detokenize",          "/metrics",        "/version"};

// The JSON body, or an answered 400.
std::optional<json> ParseBody(const http::Request& request,
                              http::Responder& responder, int* status) {
  if (request.body.empty()) {
    *status = 400;
    SendError(responder, 400, "the request body is empty: send a JSON object");
    return std::nullopt;
  }
  try {
    // nlohmann rejects invalid UTF-8 in strings.
    return json::parse(request.body);
  } catch (const json::parse_error& e) {
    *status = 400;
    SendError(responder, 400,
              absl::StrCat("the request body is not valid JSON: ", e.what()));
    return std::nullopt;
  }
}

// The value of a hex digit, or -1.
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "%2F" -> "/" and the like (a model id in a path may be percent-encoded:
// "org%2Fname"); a malformed escape stays as it is.
std::string PercentDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 &&
        HexValue(s[i + 2]) >= 0) {
      out.push_back(
          static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

OpenAiApi::OpenAiApi(GenerationCore* core, metrics::RouterMetrics* metrics,
                     ApiOptions options)
    : core_(core), metrics_(metrics), options_(std::move(options)) {}

void OpenAiApi::Handle(http::Request request,
                       std::shared_ptr<http::Responder> responder) {
  const std::string& path = request.path;
  std::string endpoint = "other";
  for (const char* known : kKnownPaths) {
    if (path == known) endpoint = known;
  }
  constexpr absl::string_view kModelPrefix = "/v1/models/";
  if (absl::StartsWith(path, kModelPrefix) &&
      path.size() > kModelPrefix.size()) {
    endpoint = "/v1/models/{model}";  // one metrics label for every id
  }
  const bool post = request.method == "POST";
  const bool get = request.method == "GET";  // HEAD arrives as GET
  auto wrong_method = [&](const char* allowed) {
    metrics_->CountHttpRequest(endpoint, 405);
    responder->Send(405, "application/json",
                    DumpJson(ErrorJson(
                        405, absl::StrCat(request.method, " ", path,
                                          " is not allowed; use ", allowed))),
                    {{"Allow", allowed}});
  };
  if (endpoint == "other") {
    metrics_->CountHttpRequest(endpoint, 404);
    SendError(*responder, 404,
              absl::StrCat("no such endpoint: ", request.method, " ", path));
    return;
  }
  if (endpoint == "/v1/chat/completions" || endpoint == "/v1/completions") {
    if (!post) return wrong_method("POST");
    return Generate(request, std::move(responder),
                    endpoint == "/v1/chat/completions");
  }
  if (endpoint == "/v1/models") {
    if (!get) return wrong_method("GET, HEAD");
    return Models(request, *responder);
  }
  if (endpoint == "/v1/models/{model}") {
    if (!get) return wrong_method("GET, HEAD");
    return Model(
        PercentDecode(absl::string_view(path).substr(kModelPrefix.size())),
        *responder);
  }
  if (endpoint == "/health") {
    if (!get) return wrong_method("GET, HEAD");
    return Health(*responder);
  }
  if (endpoint == "/version") {
    if (!get) return wrong_method("GET, HEAD");
    metrics_->CountHttpRequest(endpoint, 200);
    return responder->Send(200, "application/json",
                           DumpJson(json{{"version", kPdserveVersion}}));
  }
  if (endpoint == "/tokenize") {
    if (!post) return wrong_method("POST");
    return Tokenize(request, *responder);
  }
  if (endpoint == "/metrics") {
    if (!get) return wrong_method("GET, HEAD");
    if (!options_.metrics_text) {
      metrics_->CountHttpRequest(endpoint, 404);
      return SendError(*responder, 404, "no metrics on this server");
    }
    metrics_->CountHttpRequest(endpoint, 200);
    return responder->Send(200, "text/plain; version=0.0.4; charset=utf-8",
                           options_.metrics_text());
  }
  if (!post) return wrong_method("POST");
  Detokenize(request, *responder);
}

void OpenAiApi::SendUnknownModel(http::Responder& responder,
                                 const std::string& model) const {
  SendError(responder, 404,
            absl::StrCat("The model `", model,
                         "` does not exist; this server serves `",
                         options_.served_model_name, "`"),
            "model", "model_not_found");
}

json OpenAiApi::ModelJson() const {
  return {{"id", options_.served_model_name},
          {"object", "model"},
          {"created", options_.created},
          {"owned_by", "pdserve"},
          {"root", core_->model().name},
          {"parent", nullptr},
          {"max_model_len", core_->model().max_context}};
}

void OpenAiApi::Models(const http::Request&, http::Responder& responder) {
  metrics_->CountHttpRequest("/v1/models", 200);
  responder.Send(
      200, "application/json",
      DumpJson(json{{"object", "list"}, {"data", json::array({ModelJson()})}}));
}

void OpenAiApi::Model(const std::string& id, http::Responder& responder) {
  if (id != options_.served_model_name) {
    metrics_->CountHttpRequest("/v1/models/{model}", 404);
    return SendUnknownModel(responder, id);
  }
  metrics_->CountHttpRequest("/v1/models/{model}", 200);
  responder.Send(200, "application/json", DumpJson(ModelJson()));
}

void OpenAiApi::Health(http::Responder& responder) {
  const v1::GetModelInfoResponse info = core_->ModelInfo();
  const bool prefill_ok = info.num_prefill_workers() > 0 ||
                          core_->options().mode != RouterMode::kDisaggregated;
  const bool ok = info.num_decode_workers() > 0 && prefill_ok;
  const int status = ok ? 200 : 503;
  metrics_->CountHttpRequest("/health", status);
  json body = {{"status", ok ? "ok" : "unavailable"},
               {"prefill_workers", info.num_prefill_workers()},
               {"decode_workers", info.num_decode_workers()}};
  responder.Send(status, "application/json", DumpJson(body));
}

void OpenAiApi::Tokenize(const http::Request& request,
                         http::Responder& responder) {
  int status = 200;
  auto body = ParseBody(request, responder, &status);
  if (!body.has_value()) {
    metrics_->CountHttpRequest("/tokenize", status);
    return;
  }
  auto fail = [&](int code, const std::string& message,
                  const std::string& param) {
    metrics_->CountHttpRequest("/tokenize", code);
    SendError(responder, code, message, param);
  };
  if (!body->is_object())
    return fail(400, "the body must be a JSON object", "");
  v1::TokenizeRequest req;
  if (body->contains("messages")) {
    // The chat shape: render like /v1/chat/completions would.
    RequestError error;
    json chat_body = *body;
    auto parsed = ParseChatRequest(chat_body, &error);
    if (!parsed.has_value()) {
      return fail(400, std::string(error.status.message()), error.param);
    }
    *req.mutable_chat() = parsed->prompts[0].chat();
  } else if (body->contains("prompt")) {
    if (!(*body)["prompt"].is_string()) {
      return fail(400, "'prompt' must be a string", "prompt");
    }
    req.set_text((*body)["prompt"].get<std::string>());
  } else {
    return fail(400, "give 'prompt' or 'messages'", "prompt");
  }
  if (body->contains("add_special_tokens")) {
    if (!(*body)["add_special_tokens"].is_boolean()) {
      return fail(400, "'add_special_tokens' must be a boolean",
                  "add_special_tokens");
    }
    req.set_add_special_tokens((*body)["add_special_tokens"].get<bool>());
  }
  auto result = core_->Tokenize(req);
  if (!result.ok()) {
    return fail(HttpStatusFor(result.status().code()),
                std::string(result.status().message()),
                OpenAiParamOf(result.status(), body->contains("messages")));
  }
  json out = {{"count", result->ids_size()},
              {"max_model_len", core_->model().max_context},
              {"tokens", json(std::vector<int32_t>(result->ids().begin(),
                                                   result->ids().end()))},
              {"token_strs", nullptr}};
  metrics_->CountHttpRequest("/tokenize", 200);
  responder.Send(200, "application/json", DumpJson(out));
}

void OpenAiApi::Detokenize(const http::Request& request,
                           http::Responder& responder) {
  int status = 200;
  auto body = ParseBody(request, responder, &status);
  if (!body.has_value()) {
    metrics_->CountHttpRequest("/detokenize", status);
    return;
  }
  auto fail = [&](int code, const std::string& message) {
    metrics_->CountHttpRequest("/detokenize", code);
    SendError(responder, code, message, code == 400 ? "tokens" : "");
  };
  if (!body->is_object() || !body->contains("tokens") ||
      !(*body)["tokens"].is_array()) {
    return fail(400, "'tokens' must be a list of token ids");
  }
  std::vector<int32_t> ids;
  for (const json& id : (*body)["tokens"]) {
    if (!id.is_number_integer()) {
      return fail(400, "'tokens' must be a list of token ids");
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  if (core_->tokenizer() == nullptr) {
    return fail(400, "this router has no tokenizer");
  }
  auto text = core_->tokenizer()->Decode(ids, /*skip_special_tokens=*/false);
  if (!text.ok()) return fail(400, std::string(text.status().message()));
  metrics_->CountHttpRequest("/detokenize", 200);
  responder.Send(200, "application/json", DumpJson(json{{"prompt", *text}}));
}

void OpenAiApi::Generate(const http::Request& request,
                         std::shared_ptr<http::Responder> responder,
                         bool chat) {
  const std::string endpoint =
      chat ? "/v1/chat/completions" : "/v1/completions";
  int status = 200;
  auto body = ParseBody(request, *responder, &status);
  if (!body.has_value()) {
    metrics_->CountHttpRequest(endpoint, status);
    return;
  }
  RequestError error;
  std::optional<ParsedRequest> parsed =
      chat ? ParseChatRequest(*body, &error)
           : ParseCompletionRequest(*body, &error);
  if (!parsed.has_value()) {
    metrics_->CountHttpRequest(endpoint, 400);
    SendError(*responder, 400, std::string(error.status.message()),
              error.param);
    return;
  }
  if (!parsed->model.empty() && parsed->model != options_.served_model_name) {
    metrics_->CountHttpRequest(endpoint, 404);
    return SendUnknownModel(*responder, parsed->model);
  }
  auto job = std::make_shared<GenerationJob>(this, *std::move(parsed),
                                             std::move(responder), endpoint);
  job->Start();
}

}  // namespace pdserve::openai
