#include "tools/loadgen/openai_backend.h"

#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http.hpp"
#include "nlohmann/json.hpp"

namespace pdserve::loadgen {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;
using nlohmann::json;

int32_t StatusCodeOfHttp(int http_status) {
  switch (http_status) {
    case 200:
      return 0;
    case 400:
    case 413:
    case 422:
      return 3;  // INVALID_ARGUMENT
    case 404:
      return 5;  // NOT_FOUND
    case 429:
      return 8;  // RESOURCE_EXHAUSTED
    case 499:
      return 1;  // CANCELLED
    case 503:
      return 14;  // UNAVAILABLE
    case 504:
      return 4;  // DEADLINE_EXCEEDED
    case 500:
      return 13;  // INTERNAL
    default:
      return 2;  // UNKNOWN
  }
}

class OpenAiBackend::Impl {
 public:
  explicit Impl(const OpenAiBackendOptions& options)
      : options_(options), work_(net::make_work_guard(ioc_)) {}
  ~Impl() {
    work_.reset();
    ioc_.stop();
    for (auto& t : threads_) t.join();
  }

  absl::Status Init(absl::Duration timeout) {
    absl::string_view url = options_.base_url;
    if (!absl::ConsumePrefix(&url, "http://")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--base_url must start with http:// (got '",
                       options_.base_url, "')"));
    }
    const size_t slash = url.find('/');
    const absl::string_view hostport = url.substr(0, slash);
    prefix_ =
        slash == absl::string_view::npos ? "" : std::string(url.substr(slash));
    while (!prefix_.empty() && prefix_.back() == '/') prefix_.pop_back();
    const size_t colon = hostport.rfind(':');
    host_ = std::string(hostport.substr(0, colon));
    port_ = colon == absl::string_view::npos
                ? "80"
                : std::string(hostport.substr(colon + 1));
    target_ = options_.base_url;
    ErrorCode ec;
    tcp::resolver resolver(ioc_);
    endpoints_ = resolver.resolve(host_, port_, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot resolve ", host_, ":",
                                                 port_, ": ", ec.message()));
    }
    absl::StatusOr<json> models = Get(prefix_ + "/models", timeout);
    if (!models.ok()) {
      return absl::Status(models.status().code(),
                          absl::StrCat(options_.base_url,
                                       "/models: ", models.status().message()));
    }
    const json& data = (*models)["data"];
    if (!data.is_array() || data.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(options_.base_url, "/models lists no model"));
    }
    const json* entry = &data[0];
    for (const json& m : data) {
      if (m.value("id", "") == options_.model) entry = &m;
    }
    model_ = options_.model.empty() ? entry->value("id", "") : options_.model;
    // vLLM and pdserve report max_model_len; llama.cpp reports
    // meta.n_ctx_train.
    if (entry->contains("max_model_len") &&
        (*entry)["max_model_len"].is_number()) {
      max_context_ = (*entry)["max_model_len"].get<int32_t>();
    } else if (entry->contains("meta") &&
               (*entry)["meta"].contains("n_ctx_train")) {
      max_context_ = (*entry)["meta"]["n_ctx_train"].get<int32_t>();
    }
    for (int i = 0; i < std::max(1, options_.io_threads); ++i) {
      threads_.emplace_back([this] { ioc_.run(); });
    }
    return absl::OkStatus();
  }

  // A blocking GET (start-up only).
  absl::StatusOr<json> Get(const std::string& path, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Status last = absl::UnavailableError("no attempt");
    while (absl::Now() < deadline) {
      ErrorCode ec;
      tcp::socket socket(ioc_);
      net::connect(socket, endpoints_, ec);
      if (ec) {
        last = absl::UnavailableError(ec.message());
        absl::SleepFor(absl::Milliseconds(200));
        continue;
      }
      bhttp::request<bhttp::empty_body> req{bhttp::verb::get, path, 11};
      req.set(bhttp::field::host, host_);
      bhttp::write(socket, req, ec);
      boost::beast::flat_buffer buffer;
      bhttp::response<bhttp::string_body> res;
      if (!ec) bhttp::read(socket, buffer, res, ec);
      if (ec) {
        last = absl::UnavailableError(ec.message());
        continue;
      }
      if (res.result_int() != 200) {
        return absl::UnavailableError(
            absl::StrCat("HTTP ", res.result_int(), ": ", res.body()));
      }
      json body = json::parse(res.body(), nullptr, false);
      if (body.is_discarded()) return absl::InvalidArgumentError("not JSON");
      return body;
    }
    return last;
  }

  const OpenAiBackendOptions options_;
  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
  tcp::resolver::results_type endpoints_;
  std::string host_, port_, prefix_, target_, model_;
  int32_t max_context_ = 0;
};

namespace {

// One streamed completion on its own connection (strand-serialized).
class OpenAiCall : public BenchCall {
 public:
  OpenAiCall(OpenAiBackend::Impl* backend, const BenchRequest& request,
             int32_t index, double scheduled_s, const CallSetup& setup,
             CallObserver* observer)
      : backend_(backend),
        strand_(net::make_strand(backend->ioc_)),
        socket_(strand_),
        timer_(strand_),
        recorder_(index, scheduled_s, request.input_tokens, request.is_long),
        observer_(observer),
        t0_(setup.t0),
        timeout_(setup.request_timeout) {
    const pdserve::v1::GenerateRequest& t = setup.request_template;
    json body = {{"model", backend->model_},
                 {"max_tokens", request.max_tokens},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (!request.prompt_ids.empty()) {
      body["prompt"] = request.prompt_ids;
    } else {
      body["prompt"] = request.prompt_text;
    }
    const auto& s = t.sampling();
    if (s.has_temperature()) body["temperature"] = s.temperature();
    if (s.has_top_p()) body["top_p"] = s.top_p();
    if (s.has_top_k()) body["top_k"] = s.top_k();
    if (s.has_min_p()) body["min_p"] = s.min_p();
    if (s.has_seed()) body["seed"] = static_cast<int64_t>(s.seed());
    if (t.has_ignore_eos()) body["ignore_eos"] = t.ignore_eos();
    const std::string text = body.dump();
    request_ = absl::StrCat("POST ", backend->prefix_,
                            "/completions HTTP/1.1\r\nHost: ", backend->host_,
                            "\r\nContent-Type: application/json\r\n"
                            "Accept: text/event-stream\r\nContent-Length: ",
                            text.size(), "\r\n\r\n", text);
  }

  void Start() override {
    observer_->Started();
    recorder_.OnSent(SecondsSince(t0_));
    net::post(strand_, [this] {
      timer_.expires_after(absl::ToChronoNanoseconds(timeout_));
      timer_.async_wait([this](ErrorCode ec) {
        if (ec) return;  // cancelled: the call ended
        timed_out_ = true;
        ErrorCode ignored;
        socket_.close(ignored);
      });
      net::async_connect(socket_, backend_->endpoints_,
                         [this](ErrorCode ec, const tcp::endpoint&) {
                           if (ec) return End(14, "connect: " + ec.message());
                           net::async_write(socket_, net::buffer(request_),
                                            [this](ErrorCode ec, size_t) {
                                              if (ec)
                                                return End(14, ec.message());
                                              ReadHeader();
                                            });
                         });
    });
  }

  void Cancel() override {
    net::post(strand_, [this] {
      cancelled_ = true;
      ErrorCode ignored;
      socket_.close(ignored);
    });
  }

 private:
  void ReadHeader() {
    parser_.body_limit(boost::none);
    // The parser keeps a reference to the callback: it is a member.
    on_chunk_ = [this](std::uint64_t, boost::beast::string_view body,
                       ErrorCode&) -> std::size_t {
      OnBytes(std::string_view(body.data(), body.size()));
      return body.size();
    };
    parser_.on_chunk_body(on_chunk_);
    bhttp::async_read_header(socket_, buffer_, parser_,
                             [this](ErrorCode ec, size_t) {
                               if (ec) return EndOnError(ec);
                               status_ = parser_.get().result_int();
                               ReadMore();
                             });
  }

  void ReadMore() {
    if (parser_.is_done()) return Done();
    bhttp::async_read_some(
        socket_, buffer_, parser_, [this](ErrorCode ec, size_t) {
          // An unchunked body lands in the string body.
          const std::string& b = parser_.get().body();
          if (b.size() > unchunked_seen_) {
            OnBytes(std::string_view(b).substr(unchunked_seen_));
            unchunked_seen_ = b.size();
          }
          if (ec == bhttp::error::end_of_stream ||
              (ec == net::error::eof && parser_.is_done())) {
            return Done();
          }
          if (ec) return EndOnError(ec);
          ReadMore();
        });
  }

  // Body bytes: SSE events when the answer is 200, an error body otherwise.
  void OnBytes(std::string_view bytes) {
    if (status_ != 200) {
      error_body_.append(bytes);
      return;
    }
    sse_.append(bytes);
    size_t end;
    while ((end = sse_.find("\n\n")) != std::string::npos) {
      const std::string event = sse_.substr(0, end);
      sse_.erase(0, end + 2);
      for (absl::string_view line : absl::StrSplit(event, '\n')) {
        if (absl::ConsumePrefix(&line, "data:")) {
          OnEvent(absl::StripLeadingAsciiWhitespace(line));
        }
      }
    }
  }

  void OnEvent(absl::string_view data) {
    if (data == "[DONE]") {
      saw_done_ = true;
      return;
    }
    json chunk = json::parse(data, nullptr, false);
    if (chunk.is_discarded()) return;
    if (chunk.contains("error")) {
      const json& e = chunk["error"];
      stream_error_ = e.value("message", chunk.dump());
      stream_error_code_ = 13;
      if (e.contains("code") && e["code"].is_number()) {
        stream_error_code_ = StatusCodeOfHttp(e["code"].get<int>());
      }
      return;
    }
    if (chunk.contains("choices") && chunk["choices"].is_array() &&
        !chunk["choices"].empty()) {
      const json& c = chunk["choices"][0];
      const std::string text = c.contains("text") && c["text"].is_string()
                                   ? c["text"].get<std::string>()
                                   : "";
      if (!text.empty()) recorder_.OnMessage(SecondsSince(t0_), 1);
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
        recorder_.OnFinishReason(c["finish_reason"].get<std::string>());
      }
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      const json& u = chunk["usage"];
      recorder_.OnUsage(u.value("prompt_tokens", 0),
                        u.value("completion_tokens", 0));
    }
  }

  void Done() {
    if (status_ != 200) {
      std::string message = error_body_;
      json e = json::parse(error_body_, nullptr, false);
      if (!e.is_discarded() && e.contains("error") && e["error"].is_object()) {
        message = e["error"].value("message", error_body_);
      }
      return End(StatusCodeOfHttp(status_),
                 absl::StrCat("HTTP ", status_, ": ", message));
    }
    if (!stream_error_.empty()) return End(stream_error_code_, stream_error_);
    if (!saw_done_) return End(14, "the stream ended without data: [DONE]");
    recorder_.ReconcileWithUsage();
    End(0, "");
  }

  void EndOnError(ErrorCode ec) {
    if (timed_out_) return End(4, "deadline exceeded");
    if (cancelled_) return End(1, "cancelled");
    End(14, ec.message());
  }

  void End(int32_t code, std::string message) {
    if (ended_) return;
    ended_ = true;
    timer_.cancel();
    ErrorCode ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    observer_->Finished(
        recorder_.Finish(SecondsSince(t0_), code, std::move(message)));
  }

  OpenAiBackend::Impl* const backend_;
  net::strand<net::io_context::executor_type> strand_;
  tcp::socket socket_;
  net::steady_timer timer_;
  StreamRecorder recorder_;
  CallObserver* const observer_;
  const std::chrono::steady_clock::time_point t0_;
  const absl::Duration timeout_;
  std::string request_;
  boost::beast::flat_buffer buffer_;
  bhttp::response_parser<bhttp::string_body> parser_;
  std::function<std::size_t(std::uint64_t, boost::beast::string_view,
                            ErrorCode&)>
      on_chunk_;
  size_t unchunked_seen_ = 0;
  int status_ = 0;
  std::string sse_, error_body_, stream_error_;
  int32_t stream_error_code_ = 0;
  bool saw_done_ = false, timed_out_ = false, cancelled_ = false,
       ended_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<OpenAiBackend>> OpenAiBackend::Connect(
    const OpenAiBackendOptions& options, absl::Duration timeout) {
  auto impl = std::make_unique<Impl>(options);
  if (absl::Status s = impl->Init(timeout); !s.ok()) return s;
  return std::unique_ptr<OpenAiBackend>(new OpenAiBackend(std::move(impl)));
}

OpenAiBackend::OpenAiBackend(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
OpenAiBackend::~OpenAiBackend() = default;

const std::string& OpenAiBackend::target() const { return impl_->target_; }

absl::StatusOr<ModelInfo> OpenAiBackend::GetModelInfo(absl::Duration) {
  ModelInfo info;
  info.model = impl_->model_;
  info.mode = "openai";
  info.vocab_size = impl_->options_.vocab_size;
  info.max_context = impl_->max_context_;
  return info;
}

std::unique_ptr<BenchCall> OpenAiBackend::NewCall(const BenchRequest& request,
                                                  int32_t index,
                                                  double scheduled_s,
                                                  const CallSetup& setup,
                                                  CallObserver* observer) {
  return std::make_unique<OpenAiCall>(impl_.get(), request, index, scheduled_s,
                                      setup, observer);
}

}  // namespace pdserve::loadgen
