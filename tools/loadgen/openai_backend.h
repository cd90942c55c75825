// OpenAI backend of `pdserve bench` (--backend=openai): drives any
// OpenAI-compatible server (pdserve's HTTP API, vLLM, llama.cpp's server)
// with streamed POST /v1/completions, so one load generator compares pdserve
// with its peers. Asynchronous (Boost.Beast on its own I/O threads): a
// thousand concurrent streams need no thousand threads. Each SSE chunk with
// text counts as one message of one token (vLLM's benchmark does the same);
// the server's final usage corrects the total when a chunk held several.
// Thread-safe.
#ifndef PDSERVE_TOOLS_LOADGEN_OPENAI_BACKEND_H_
#define PDSERVE_TOOLS_LOADGEN_OPENAI_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tools/loadgen/backend.h"

namespace pdserve::loadgen {

struct OpenAiBackendOptions {
  std::string base_url;  // http://HOST:PORT/v1 (https is not supported)
  std::string model;     // the `model` field; "" = the server's first model
  // The vocabulary size for random token-id prompts (the OpenAI API does not
  // report it): from a local tokenizer.json.
  int32_t vocab_size = 0;
  int io_threads = 2;
};

class OpenAiBackend : public BenchBackend {
 public:
  // Parses the URL and asks GET {base_url}/models (within `timeout`) for the
  // model's name and context length.
  static absl::StatusOr<std::unique_ptr<OpenAiBackend>> Connect(
      const OpenAiBackendOptions& options, absl::Duration timeout);
  ~OpenAiBackend() override;

  const std::string& target() const override;
  absl::StatusOr<ModelInfo> GetModelInfo(absl::Duration timeout) override;
  std::unique_ptr<BenchCall> NewCall(const BenchRequest& request, int32_t index,
                                     double scheduled_s, const CallSetup& setup,
                                     CallObserver* observer) override;

  class Impl;

 private:
  explicit OpenAiBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The gRPC status code (as RequestRecord keeps) of an HTTP status.
int32_t StatusCodeOfHttp(int http_status);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_TOOLS_LOADGEN_OPENAI_BACKEND_H_
