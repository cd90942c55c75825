// GenerationJob: one OpenAI generation request in flight. Its choices (each
// prompt sampled n times) run as requests of the GenerationCore; their
// token streams are aggregated into one chat.completion / text_completion
// body, or streamed as server-sent events (chunks, an optional usage chunk,
// `data: [DONE]`). The first choice of each prompt starts alone and the
// other n-1 once it produced its first token, so the prompt is prefilled
// once and the others hit the prefix cache; the prompt's scores (echo with
// logprobs, prompt_logprobs) are computed by that first choice only and
// shared, and a prompt-only request (max_tokens 0, nothing sampled) runs
// once for all n. An error before anything was
// streamed is an HTTP error status; after, one `data: {"error": ...}` event.
// A client that goes away cancels every choice. Thread-safe.
#ifndef PDSERVE_ROUTER_HTTP_OPENAI_JOB_H_
#define PDSERVE_ROUTER_HTTP_OPENAI_JOB_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "router/generation_core.h"
#include "router/http/http_server.h"
#include "router/http/openai_request.h"
#include "router/http/openai_response.h"

namespace pdserve::openai {

class OpenAiApi;

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  // `endpoint` names the API path for the metrics.
  GenerationJob(const OpenAiApi* api, ParsedRequest parsed,
                std::shared_ptr<http::Responder> responder,
                std::string endpoint);
  void Start();

 private:
  class ChoiceSink;
  struct Choice {
    int prompt = 0;  // index into parsed_.prompts
    int index = 0;   // OpenAI choice index
    std::string text;
    // Completions: the next token's text_offset, code points of the token
    // texts before it (the echoed prompt's included), whatever the
    // messages' boundaries: streamed and whole responses agree.
    int64_t next_offset = 0;
    nlohmann::json logprobs;  // chat: {"content": [...]}; completions shape
    std::optional<TokenTexts> token_texts;  // from the first message
    nlohmann::json prompt_logprobs;         // vLLM's, when asked for
    std::string finish_reason;
    int prompt_tokens = 0;
    int completion_tokens = 0;
    bool launched = false, sent_any = false, done = false;
    std::shared_ptr<RequestHandle> handle;
  };

  bool OnMessage(int c, const pdserve::v1::GenerateResponse& msg);
  void OnFinish(int c, const RequestEnd& end);
  // Starts choices (outside the lock: the core may finish them inline).
  void Launch(const std::vector<int>& choices);
  // The other n-1 choices of choice c's prompt, once c has started.
  std::vector<int> SiblingsToLaunch(int c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Handles of launched choices not done (cancel them outside the lock).
  std::vector<std::shared_ptr<RequestHandle>> Unfinished()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SendEvent(const nlohmann::json& data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  nlohmann::json ChunkHead() const;
  nlohmann::json Usage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const RequestEnd& end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClientGone();

  const OpenAiApi* const api_;
  const ParsedRequest parsed_;
  const std::shared_ptr<http::Responder> responder_;
  const std::string endpoint_;
  const bool chat_;
  std::string id_;
  int64_t created_ = 0;
  std::string fingerprint_;
  uint64_t base_seed_ = 0;  // parsed_.seed, or random when unseeded

  absl::Mutex mu_;
  std::vector<Choice> choices_ ABSL_GUARDED_BY(mu_);
  std::vector<std::optional<std::string>> echo_ ABSL_GUARDED_BY(mu_);
  // Per prompt: its ids and scores (prompt_ids, prompt_logprobs) from the
  // first message that carried them; the choices launched after it do not
  // score the prompt again.
  std::vector<std::optional<pdserve::v1::GenerateResponse>> prompt_scores_
      ABSL_GUARDED_BY(mu_);
  bool streaming_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // response complete or failed
  int remaining_ ABSL_GUARDED_BY(mu_) = 0;      // choices not done
};

}  // namespace pdserve::openai

#endif  // PDSERVE_ROUTER_HTTP_OPENAI_JOB_H_
