#include "router/http/openai_job.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "router/http/openai_api.h"
#include "router/http/openai_response.h"
#include "router/request_builder.h"

namespace pdserve::openai {

namespace v1 = ::pdserve::v1;
using nlohmann::json;

namespace {

uint64_t RandomU64() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

}  // namespace

// Forwards one request's messages to the job as those of its choices: one,
// or all n of a prompt-only request (nothing is sampled, so every choice
// is the same).
class GenerationJob::ChoiceSink : public ResponseSink {
 public:
  ChoiceSink(std::shared_ptr<GenerationJob> job, std::vector<int> choices)
      : job_(std::move(job)), choices_(std::move(choices)) {}
  bool Write(const v1::GenerateResponse& msg) override {
    for (int c : choices_) {
      if (!job_->OnMessage(c, msg)) return false;
    }
    return true;
  }
  void Finish(const RequestEnd& end) override {
    for (int c : choices_) job_->OnFinish(c, end);
  }

 private:
  const std::shared_ptr<GenerationJob> job_;
  const std::vector<int> choices_;
};

GenerationJob::GenerationJob(const OpenAiApi* api, ParsedRequest parsed,
                             std::shared_ptr<http::Responder> responder,
                             std::string endpoint)
    : api_(api),
      parsed_(std::move(parsed)),
      responder_(std::move(responder)),
      endpoint_(std::move(endpoint)),
      chat_(parsed_.endpoint == Endpoint::kChat) {
  id_ = absl::StrFormat("%s-%016x%08x", chat_ ? "chatcmpl" : "cmpl",
                        RandomU64(), static_cast<uint32_t>(RandomU64()));
  created_ = absl::ToUnixSeconds(absl::Now());
  base_seed_ = parsed_.seed.has_value() ? *parsed_.seed : RandomU64();
  fingerprint_ = api_->core()->ModelInfo().fingerprint();
  absl::MutexLock lock(&mu_);
  const Tokenizer* tok = api_->core()->tokenizer();
  for (size_t p = 0; p < parsed_.prompts.size(); ++p) {
    std::optional<std::string> echo;
    if (parsed_.echo) {
      if (parsed_.prompt_texts[p].has_value()) {
        echo = *parsed_.prompt_texts[p];
      } else if (tok != nullptr && parsed_.prompts[p].has_token_ids()) {
        const auto& ids = parsed_.prompts[p].token_ids().ids();
        auto text =
            tok->Decode(std::vector<int32_t>(ids.begin(), ids.end()), false);
        if (text.ok()) echo = *text;
      }
    }
    echo_.push_back(std::move(echo));
    prompt_scores_.emplace_back();
    for (int i = 0; i < parsed_.n; ++i) {
      Choice c;
      c.prompt = static_cast<int>(p);
      c.index = static_cast<int>(p) * parsed_.n + i;
      c.logprobs =
          chat_ ? json{{"content", json::array()}} : EmptyCompletionLogprobs();
      choices_.push_back(std::move(c));
    }
  }
  remaining_ = static_cast<int>(choices_.size());
}

void GenerationJob::Start() {
  std::weak_ptr<GenerationJob> weak = shared_from_this();
  responder_->SetOnClientGone([weak] {
    if (auto job = weak.lock()) job->ClientGone();
  });
  std::vector<int> first;
  {
    absl::MutexLock lock(&mu_);
    for (size_t c = 0; c < choices_.size(); c += parsed_.n) {
      first.push_back(static_cast<int>(c));
    }
  }
  Launch(first);
}

void GenerationJob::Launch(const std::vector<int>& choices) {
  for (int c : choices) {
    v1::GenerateRequest request;
    std::vector<int> served = {c};
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || choices_[c].launched) continue;
      choices_[c].launched = true;
      request = parsed_.prompts[choices_[c].prompt];
      const bool prompt_only =
          request.has_max_tokens() && request.max_tokens() == 0;
      if (prompt_only && c % parsed_.n == 0) {
        // Nothing is sampled: the other choices are this one's copies.
        for (int i = c + 1; i < c + parsed_.n; ++i) {
          choices_[i].launched = true;
          served.push_back(i);
        }
      } else if (request.has_prompt_logprobs() &&
                 prompt_scores_[choices_[c].prompt].has_value()) {
        // The prompt's scores are known (the siblings start after the
        // first message): reuse them rather than computing the whole
        // prompt again (scoring reuses no cached prefix).
        request.clear_prompt_logprobs();
      }
    }
    const int i = c % parsed_.n;
    request.set_request_id(absl::StrCat(id_, "-", c));
    request.mutable_sampling()->set_seed(ChoiceSeed(base_seed_, i));
    auto handle = api_->core()->Generate(
        request, absl::InfiniteFuture(),
        std::make_shared<ChoiceSink>(shared_from_this(), std::move(served)));
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      choices_[c].handle = handle;
      cancel = finished_ && !choices_[c].done;
    }
    if (cancel) handle->Cancel();
  }
}

std::vector<int> GenerationJob::SiblingsToLaunch(int c) {
  std::vector<int> out;
  if (c % parsed_.n != 0) return out;
  for (int i = 1; i < parsed_.n; ++i) {
    if (!choices_[c + i].launched) out.push_back(c + i);
  }
  return out;
}

json GenerationJob::ChunkHead() const {
  json head = {{"id", id_},
               {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
               {"created", created_},
               {"model", api_->options().served_model_name},
               {"system_fingerprint", fingerprint_}};
  return head;
}

void GenerationJob::StartStreamLocked() {
  if (streaming_) return;
  streaming_ = true;
  api_->metrics()->CountHttpRequest(endpoint_, 200);
  responder_->StartStream(
      200, "text/event-stream",
      {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
}

bool GenerationJob::SendEvent(const json& data) {
  return responder_->SendChunk(absl::StrCat("data: ", DumpJson(data), "\n\n"));
}

bool GenerationJob::OnMessage(int c, const v1::GenerateResponse& msg) {
  std::vector<int> launch;
  bool alive = true;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    Choice& choice = choices_[c];
    const Tokenizer* tok = api_->core()->tokenizer();
    std::string text = msg.text();
    const bool first = !choice.sent_any;
    choice.sent_any = true;
    if (first && echo_[choice.prompt].has_value()) {
      text = *echo_[choice.prompt] + text;
    }
    std::optional<v1::GenerateResponse>& stored = prompt_scores_[choice.prompt];
    if (parsed_.n > 1 && first && !stored.has_value() &&
        msg.prompt_logprobs_size() > 0) {  // kept for the other choices
      stored.emplace();
      *stored->mutable_prompt_ids() = msg.prompt_ids();
      *stored->mutable_prompt_logprobs() = msg.prompt_logprobs();
    }
    // Where this choice reads the prompt's scores (its own, or its prompt's
    // first choice's).
    const v1::GenerateResponse& scores = stored.has_value() ? *stored : msg;
    json logprobs_delta;
    if (parsed_.logprobs) {
      logprobs_delta =
          chat_ ? json{{"content", json::array()}} : EmptyCompletionLogprobs();
      const bool echo_scores = !chat_ && parsed_.echo;
      if (!choice.token_texts.has_value()) {
        // The first message carries the prompt's ids: the context of the
        // first generated token's text, or (echo) the prompt's own tokens.
        std::vector<int32_t> context;
        if (!echo_scores) {
          context.assign(msg.prompt_ids().begin(), msg.prompt_ids().end());
        }
        choice.token_texts.emplace(tok, parsed_.tokens_as_ids, context);
      }
      TokenTexts& texts = *choice.token_texts;
      if (first && echo_scores) {
        // The echoed prompt's tokens come first, each scored by the ones
        // before it (the first by none: null).
        choice.next_offset = AppendPromptCompletionLogprobs(
            scores, parsed_.top_logprobs, &texts, &logprobs_delta);
      }
      int64_t offset = choice.next_offset;
      for (const v1::GeneratedToken& t : msg.tokens()) {
        const TokenTexts::Entry entry = texts.Next(t.id(), t.top_logprobs());
        if (chat_) {
          logprobs_delta["content"].push_back(ChatLogprob(entry, t));
        } else {
          AppendCompletionLogprob(entry, t, offset, &logprobs_delta);
          offset += entry.code_points;
        }
      }
      choice.next_offset = offset;
      if (chat_) {
        for (const json& e : logprobs_delta["content"]) {
          choice.logprobs["content"].push_back(e);
        }
      } else {
        ExtendCompletionLogprobs(logprobs_delta, &choice.logprobs);
      }
    }
    if (first && parsed_.prompt_logprobs.has_value()) {
      TokenTexts prompt_texts(tok, parsed_.tokens_as_ids, {});
      choice.prompt_logprobs =
          VllmPromptLogprobs(scores, *parsed_.prompt_logprobs, &prompt_texts);
    }
    choice.text += text;
    if (msg.finished()) {
      choice.finish_reason = OpenAiFinishReason(msg.finish_reason());
      choice.prompt_tokens = msg.usage().prompt_tokens();
      choice.completion_tokens = msg.usage().completion_tokens();
    }
    if (parsed_.stream) {
      StartStreamLocked();
      json chunk = ChunkHead();
      json entry = {{"index", choice.index}};
      if (chat_) {
        if (first) {
          json role = chunk;
          role["choices"] =
              json::array({{{"index", choice.index},
                            {"delta", {{"role", "assistant"}, {"content", ""}}},
                            {"logprobs", nullptr},
                            {"finish_reason", nullptr}}});
          if (parsed_.include_usage) role["usage"] = nullptr;
          alive = SendEvent(role);
        }
        entry["delta"] =
            text.empty() ? json::object() : json{{"content", text}};
      } else {
        entry["text"] = text;
      }
      entry["logprobs"] = parsed_.logprobs ? logprobs_delta : json(nullptr);
      entry["finish_reason"] =
          msg.finished() ? json(choice.finish_reason) : json(nullptr);
      chunk["choices"] = json::array({std::move(entry)});
      if (parsed_.include_usage) chunk["usage"] = nullptr;
      // A message without text or tokens (e.g. the final one after the
      // last token) still carries the finish reason.
      if (alive && (!text.empty() || msg.tokens_size() > 0 || msg.finished())) {
        alive = SendEvent(chunk);
      }
    }
    if (first) launch = SiblingsToLaunch(c);
  }
  if (!alive) {
    ClientGone();
    return false;
  }
  Launch(launch);
  return true;
}

void GenerationJob::OnFinish(int c, const RequestEnd& end) {
  std::vector<int> launch;
  std::vector<std::shared_ptr<RequestHandle>> cancel;
  {
    absl::MutexLock lock(&mu_);
    Choice& choice = choices_[c];
    if (choice.done) return;
    choice.done = true;
    --remaining_;
    if (finished_) return;
    if (!end.status.ok()) {
      Fail(end);
      cancel = Unfinished();
    } else if (remaining_ == 0) {
      Complete();
    } else {
      launch = SiblingsToLaunch(c);  // choice c finished without streaming
    }
  }
  // Outside the lock: a cancel may finish its choice inline.
  for (auto& h : cancel) h->Cancel();
  Launch(launch);
}

json GenerationJob::Usage() const {
  int64_t prompt = 0, completion = 0;
  for (const Choice& c : choices_) {
    if (c.index % parsed_.n == 0) prompt += c.prompt_tokens;
    completion += c.completion_tokens;
  }
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion}};
}

void GenerationJob::Complete() {
  finished_ = true;
  if (parsed_.stream) {
    StartStreamLocked();  // every choice finished without a message
    if (parsed_.include_usage) {
      json chunk = ChunkHead();
      chunk["choices"] = json::array();
      chunk["usage"] = Usage();
      SendEvent(chunk);
    }
    responder_->SendChunk("data: [DONE]\n\n");
    responder_->EndStream();
    return;
  }
  json body = ChunkHead();
  body["object"] = chat_ ? "chat.completion" : "text_completion";
  json choices = json::array();
  for (const Choice& c : choices_) {
    json entry = {{"index", c.index}};
    if (chat_) {
      entry["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      entry["text"] = c.text;
    }
    entry["logprobs"] = parsed_.logprobs ? c.logprobs : json(nullptr);
    entry["finish_reason"] = c.finish_reason;
    // vLLM puts a completion's prompt logprobs on each choice, a chat's on
    // the response (below).
    if (!chat_ && parsed_.prompt_logprobs.has_value()) {
      entry["prompt_logprobs"] = c.prompt_logprobs;
    }
    choices.push_back(std::move(entry));
  }
  body["choices"] = std::move(choices);
  if (chat_ && parsed_.prompt_logprobs.has_value()) {
    body["prompt_logprobs"] = choices_[0].prompt_logprobs;
  }
  body["usage"] = Usage();
  api_->metrics()->CountHttpRequest(endpoint_, 200);
  responder_->Send(200, "application/json", DumpJson(body));
}

void GenerationJob::Fail(const RequestEnd& end) {
  finished_ = true;
  const int status = HttpStatusFor(end.status.code());
  const std::string param = OpenAiParamOf(end.status, chat_);
  if (!streaming_) {
    api_->metrics()->CountHttpRequest(endpoint_, status);
    SendError(*responder_, status, std::string(end.status.message()), param,
              InvalidReason(end.status), end.retry_after_ms);
    return;
  }
  SendEvent(ErrorJson(status, std::string(end.status.message()), param,
                      InvalidReason(end.status)));
  responder_->SendChunk("data: [DONE]\n\n");
  responder_->EndStream();
}

std::vector<std::shared_ptr<RequestHandle>> GenerationJob::Unfinished() {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (Choice& c : choices_) {
    if (c.handle != nullptr && !c.done) handles.push_back(c.handle);
  }
  return handles;
}

void GenerationJob::ClientGone() {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  {
    absl::MutexLock lock(&mu_);
    if (!finished_) {
      finished_ = true;
      api_->metrics()->CountHttpRequest(endpoint_, 499);
    }
    handles = Unfinished();
  }
  // Outside the lock: a cancel may finish the choice inline.
  for (auto& h : handles) h->Cancel();
}

}  // namespace pdserve::openai
