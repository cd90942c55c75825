#include "router/generation_core.h"

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/logging.h"
#include "google/protobuf/descriptor.h"

namespace pdserve {

namespace v1 = ::pdserve::v1;

namespace {

// 16 hex digits from the OS's entropy source.
std::string RandomInstanceId() {
  std::random_device entropy;
  const uint64_t id = (uint64_t{entropy()} << 32) ^ entropy();
  return absl::StrCat(absl::Hex(id, absl::kZeroPad16));
}

}  // namespace

absl::StatusOr<RouterMode> ParseRouterMode(const std::string& s) {
  if (s == "disaggregated") return RouterMode::kDisaggregated;
  if (s == "colocated") return RouterMode::kColocated;
  if (s == "auto") return RouterMode::kAuto;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown --mode '", s, "' (disaggregated, colocated or auto)"));
}

absl::Status CheckRouterOptions(const RouterOptions& o) {
  // Each: the flag that sets it, whether it is in range, the range.
  struct Check {
    const char* flag;
    bool ok;
    const char* range;
  };
  const RequestLimits& l = o.limits;
  for (const Check& c : {
           Check{"auto_prefill_threshold", o.auto_prefill_threshold >= 0,
                 ">= 0"},
           Check{"auto_stall_weight", o.auto_stall_weight >= 0, ">= 0"},
           Check{"worker_wait", o.worker_wait >= absl::ZeroDuration(), ">= 0"},
           Check{"max_attempts", o.max_attempts >= 1, ">= 1"},
           Check{"max_migrations", o.max_migrations >= 0, ">= 0"},
           Check{"prefix_routing_blocks", o.prefix_routing_blocks >= 0,
                 ">= 0 (0 = off)"},
           Check{"prefix_routing_max_extra_load",
                 o.prefix_routing_max_extra_load >= 0, ">= 0"},
           Check{"max_in_flight", o.max_in_flight >= 0, ">= 0 (0 = unbounded)"},
           Check{"admission_queue", o.admission_queue >= 0, ">= 0"},
           Check{"admission_timeout",
                 o.admission_timeout >= absl::ZeroDuration(), ">= 0"},
           Check{"retry_after_ms", o.retry_after_ms >= 0, ">= 0"},
           Check{"max_tokens_cap", l.max_tokens_cap >= 1, ">= 1"},
           Check{"default_max_tokens",
                 l.default_max_tokens >= 1 &&
                     l.default_max_tokens <= l.max_tokens_cap,
                 "in [1, --max_tokens_cap]"},
           Check{"max_prompt_tokens", l.max_prompt_tokens >= 1, ">= 1"},
           Check{"max_stop_strings", l.max_stop_strings >= 0, ">= 0"},
           Check{"max_request_bytes", l.max_request_bytes >= 1, ">= 1"},
       }) {
    if (!c.ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", c.flag, " must be ", c.range));
    }
  }
  return absl::OkStatus();
}

const char* RouterModeName(RouterMode mode) {
  switch (mode) {
    case RouterMode::kDisaggregated:
      return "disaggregated";
    case RouterMode::kColocated:
      return "colocated";
    case RouterMode::kAuto:
      return "auto";
  }
  return "?";
}

metrics::StageTimings StageTimingsFromProto(const v1::StageTimings& t) {
  metrics::StageTimings out;
  const auto* desc = t.GetDescriptor();
  const auto* refl = t.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* f = desc->field(i);
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE ||
        !refl->HasField(t, f)) {
      continue;
    }
    if (auto stage = metrics::StageFromName(f->name())) {
      out.Set(*stage, refl->GetDouble(t, f));
    }
  }
  return out;
}

void RequestHandle::Cancel() {
  std::shared_ptr<RequestRun> run;
  GenerationCore* waiting_in = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    run = run_;
    waiting_in = waiting_in_;
  }
  if (waiting_in != nullptr && waiting_in->CancelWaiting(this)) return;
  if (run != nullptr) run->Cancel();
}

GenerationCore::GenerationCore(
    RouterOptions options, RouterModelInfo model,
    std::unique_ptr<Tokenizer> tokenizer,
    absl::StatusOr<ModelChatTemplates> chat_templates, WorkerPool* prefill,
    WorkerPool* decode, metrics::RouterMetrics* metrics)
    : options_(std::move(options)),
      model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      prefill_(prefill),
      decode_(decode),
      metrics_(metrics),
      instance_id_(RandomInstanceId()) {
  if (chat_templates.ok()) {
    chat_templates_ = *std::move(chat_templates);
    chat_.templates = &*chat_templates_;
  } else {
    chat_.unavailable = chat_templates.status();
  }
  env_.options = &options_;
  env_.tokenizer = tokenizer_.get();
  env_.prefill = prefill_;
  env_.decode = decode_;
  env_.metrics = metrics_;
  env_.handoff_seconds = &handoff_seconds_;
  env_.timers = &run_timers_;
  admission_timer_ = std::thread([this] { AdmissionTimerLoop(); });
}

GenerationCore::~GenerationCore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  admission_timer_.join();
}

int GenerationCore::in_flight() const {
  absl::MutexLock lock(&mu_);
  return running_ + static_cast<int>(waiting_.size());
}

void GenerationCore::EndUnrun(ResponseSink& sink, absl::Time arrival,
                              const RequestEnd& end) {
  // Counted before the client sees the end (as RequestRun::End does).
  metrics::RequestSummary summary;
  summary.code = end.status.code();
  summary.e2e_seconds = absl::ToDoubleSeconds(absl::Now() - arrival);
  metrics_->RequestFinished(summary);
  sink.Finish(end);
}

std::shared_ptr<RequestHandle> GenerationCore::Generate(
    const v1::GenerateRequest& request, absl::Time deadline,
    std::shared_ptr<ResponseSink> sink) {
  const absl::Time arrival = absl::Now();
  metrics_->RequestStarted();
  auto handle = std::make_shared<RequestHandle>();
  RequestEnd refused;
  if (draining_.load()) {
    refused.status = absl::UnavailableError("router is draining");
    EndUnrun(*sink, arrival, refused);
    return handle;
  }
  auto resolved =
      ResolveRequest(request, tokenizer_.get(), chat_, model_, options_.limits);
  if (!resolved.ok()) {
    refused.status = resolved.status();
    EndUnrun(*sink, arrival, refused);
    return handle;
  }
  // The client's id is a label it may reuse (two clients may pick the same
  // one at once); the workers key prefill jobs and KV leases by a key that
  // keeps it for the logs but is unique among every router's requests.
  const uint64_t serial = next_id_.fetch_add(1);
  std::string request_id = request.request_id().empty()
                               ? absl::StrCat("req-", instance_id_, "-", serial)
                               : request.request_id();
  std::string worker_key =
      absl::StrCat(request_id, "@", instance_id_, ".", serial);
  auto on_end = [this, arrival, key = worker_key](const RequestEnd& end,
                                                  const ClientStream& s) {
    OnRunEnd(end, s, arrival, key);
  };
  auto run = RequestRun::Create(env_, std::move(request_id),
                                std::move(worker_key), *std::move(resolved),
                                arrival, deadline, sink, std::move(on_end));
  bool start_now = false;
  const int64_t limit = AdmissionLimit();
  {
    absl::MutexLock lock(&mu_);
    // FIFO: nobody overtakes a waiting request (the limit may have grown
    // since it queued; the admission timer lets it in within 200 ms).
    if ((limit <= 0 || running_ < limit) && waiting_.empty()) {
      ++running_;
      start_now = true;
    } else if (static_cast<int>(waiting_.size()) < options_.admission_queue) {
      Waiting w;
      w.handle = handle;
      w.run = run;
      w.sink = sink;
      w.arrival = arrival;
      w.give_up = arrival + options_.admission_timeout;
      if (deadline < w.give_up) {
        w.give_up = deadline;
        w.deadline_first = true;
      }
      {
        absl::MutexLock hl(&handle->mu_);
        handle->waiting_in_ = this;
        handle->run_ = run;
      }
      waiting_.push_back(std::move(w));
      metrics_->SetAdmissionQueueLength(static_cast<int64_t>(waiting_.size()));
    } else {
      refused.status = absl::ResourceExhaustedError(absl::StrCat(
          "router overloaded: ", running_, " requests running (max ", limit,
          ": --max_in_flight and what the workers hold) and ", waiting_.size(),
          " waiting for admission (max ", options_.admission_queue,
          "); retry later"));
      refused.retry_after_ms = options_.retry_after_ms;
    }
  }
  if (start_now) {
    Launch(handle, run);
  } else if (!refused.status.ok()) {
    EndUnrun(*sink, arrival, refused);
  }
  return handle;
}

void GenerationCore::DetachRun(RequestHandle& handle) {
  absl::MutexLock lock(&handle.mu_);
  handle.waiting_in_ = nullptr;
  handle.run_.reset();
}

void GenerationCore::Launch(const std::shared_ptr<RequestHandle>& handle,
                            const std::shared_ptr<RequestRun>& run) {
  bool cancelled;
  {
    absl::MutexLock lock(&handle->mu_);
    handle->waiting_in_ = nullptr;
    handle->run_ = run;
    cancelled = handle->cancelled_;
  }
  {
    absl::MutexLock lock(&mu_);
    launched_[run->worker_key()] = run;
  }
  run->Start();
  if (cancelled) run->Cancel();
}

void GenerationCore::StopRunning(const absl::Status& why) {
  std::vector<std::shared_ptr<RequestRun>> runs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, weak] : launched_) {
      if (auto run = weak.lock()) runs.push_back(std::move(run));
    }
  }
  for (const auto& run : runs) run->CancelWith(why);
}

void GenerationCore::OnRunEnd(const RequestEnd& end, const ClientStream& stream,
                              absl::Time arrival,
                              const std::string& worker_key) {
  metrics::RequestSummary summary;
  summary.code = end.status.code();
  summary.e2e_seconds = absl::ToDoubleSeconds(absl::Now() - arrival);
  summary.prompt_tokens =
      static_cast<int64_t>(stream.request().prompt_ids.size());
  summary.output_tokens = stream.completion_tokens();
  summary.ttft_seconds = stream.ttft_seconds();
  if (end.status.ok() && stream.final_timings().has_value()) {
    summary.e2e_seconds = stream.final_timings()->e2e();
    summary.stages = StageTimingsFromProto(*stream.final_timings());
  }
  metrics_->RequestFinished(summary);
  // Its retries and migrations were logged as they happened; the final
  // failure is the line an operator searches for (clients that went away or
  // ran out of time are not failures of the service).
  if (!end.status.ok() && !absl::IsCancelled(end.status) &&
      !absl::IsDeadlineExceeded(end.status)) {
    PDSERVE_LOG_WARNING("request %s failed: %s", stream.request_id(),
                        end.status.ToString());
  }
  // Admit waiting requests into the freed slot (more than one when the
  // workers' capacity grew meanwhile).
  const int64_t limit = AdmissionLimit();
  std::vector<Waiting> admitted;
  {
    absl::MutexLock lock(&mu_);
    --running_;
    launched_.erase(worker_key);
    admitted = TakeAdmittedLocked(limit);
  }
  for (Waiting& w : admitted) Launch(w.handle, w.run);
}

int64_t GenerationCore::AdmissionLimit() const {
  int64_t limit = options_.max_in_flight;  // 0 = unbounded
  const auto bound_by = [&limit](int64_t capacity) {
    if (capacity > 0 && (limit <= 0 || capacity < limit)) limit = capacity;
  };
  bound_by(decode_->RequestCapacity());
  // Without a healthy prefill worker, decode workers prefill instead when
  // --colocated_fallback allows: then P's last capacity bounds nothing.
  const bool prefill_bypassed =
      options_.mode == RouterMode::kColocated ||
      (options_.colocated_fallback && prefill_->healthy_count() == 0);
  if (!prefill_bypassed) bound_by(prefill_->RequestCapacity());
  metrics_->SetAdmissionLimit(limit);
  return limit;
}

std::vector<GenerationCore::Waiting> GenerationCore::TakeAdmittedLocked(
    int64_t limit) {
  std::vector<Waiting> admitted;
  while (!waiting_.empty() && !draining_.load() &&
         (limit <= 0 || running_ < limit)) {
    metrics_->ObserveAdmissionWait(
        absl::ToDoubleSeconds(absl::Now() - waiting_.front().arrival));
    admitted.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    ++running_;
  }
  if (!admitted.empty()) {
    metrics_->SetAdmissionQueueLength(static_cast<int64_t>(waiting_.size()));
  }
  return admitted;
}

bool GenerationCore::CancelWaiting(RequestHandle* handle) {
  Waiting removed;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(
        waiting_.begin(), waiting_.end(),
        [&](const Waiting& w) { return w.handle.get() == handle; });
    if (it == waiting_.end()) return false;
    removed = std::move(*it);
    waiting_.erase(it);
    metrics_->SetAdmissionQueueLength(static_cast<int64_t>(waiting_.size()));
  }
  metrics_->ObserveAdmissionWait(
      absl::ToDoubleSeconds(absl::Now() - removed.arrival));
  RequestEnd end;
  end.status =
      absl::CancelledError("client cancelled while waiting for admission");
  EndUnrun(*removed.sink, removed.arrival, end);
  DetachRun(*removed.handle);
  return true;
}

void GenerationCore::AdmissionTimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    // The workers' capacity may have grown (a worker became healthy) with
    // no request ending to admit the next: admit what fits now.
    if (!waiting_.empty()) {
      mu_.Unlock();
      const int64_t limit = AdmissionLimit();
      mu_.Lock();
      std::vector<Waiting> admitted = TakeAdmittedLocked(limit);
      if (!admitted.empty()) {
        mu_.Unlock();
        for (Waiting& w : admitted) Launch(w.handle, w.run);
        mu_.Lock();
        continue;
      }
    }
    const absl::Time now = absl::Now();
    absl::Time next = now + absl::Milliseconds(200);
    std::vector<Waiting> expired;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->give_up <= now || draining_.load()) {
        expired.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        next = std::min(next, it->give_up);
        ++it;
      }
    }
    if (!expired.empty()) {
      metrics_->SetAdmissionQueueLength(static_cast<int64_t>(waiting_.size()));
      mu_.Unlock();
      for (Waiting& w : expired) {
        metrics_->ObserveAdmissionWait(
            absl::ToDoubleSeconds(absl::Now() - w.arrival));
        RequestEnd end;
        if (draining_.load()) {
          end.status = absl::UnavailableError("router is draining");
        } else if (w.deadline_first) {
          end.status = absl::DeadlineExceededError(
              "deadline exceeded while waiting for admission");
        } else {
          end.status = absl::ResourceExhaustedError(absl::StrCat(
              "router overloaded: waited ",
              absl::FormatDuration(options_.admission_timeout),
              " for admission (--admission_timeout); retry later"));
          end.retry_after_ms = options_.retry_after_ms;
        }
        EndUnrun(*w.sink, w.arrival, end);
        DetachRun(*w.handle);
      }
      mu_.Lock();
      continue;
    }
    mu_.AwaitWithDeadline(absl::Condition(&stop_), next);
  }
}

absl::StatusOr<v1::TokenizeResponse> GenerationCore::Tokenize(
    const v1::TokenizeRequest& request) const {
  if (tokenizer_ == nullptr) {
    return absl::FailedPreconditionError("this router has no tokenizer");
  }
  if (request.ByteSizeLong() >
      static_cast<size_t>(options_.limits.max_request_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request is ", request.ByteSizeLong(),
        " bytes, more than the limit of ", options_.limits.max_request_bytes));
  }
  v1::TokenizeResponse response;
  std::vector<int32_t> ids;
  if (request.has_chat()) {
    auto rendered = RenderChat(request.chat(), chat_, tokenizer_.get());
    if (!rendered.ok()) return rendered.status();
    response.set_rendered(std::move(rendered->text));
    ids = std::move(rendered->ids);
  } else {
    auto encoded = tokenizer_->Encode(
        request.text(),
        request.has_add_special_tokens() ? request.add_special_tokens() : true);
    if (!encoded.ok()) {
      return absl::InvalidArgumentError(encoded.status().message());
    }
    ids = *std::move(encoded);
  }
  for (int32_t id : ids) {
    response.add_ids(id);
    auto piece = tokenizer_->Decode({id}, false);
    response.add_pieces(piece.ok() ? *piece : "");
  }
  return response;
}

v1::GetModelInfoResponse GenerationCore::ModelInfo() const {
  v1::GetModelInfoResponse r;
  r.set_model(model_.name);
  r.set_vocab_size(model_.vocab_size);
  r.set_max_context(model_.max_context);
  for (int32_t id : model_.eos_ids) r.add_eos_token_ids(id);
  r.set_bos_token_id(model_.bos_id.value_or(-1));
  r.set_mode(RouterModeName(options_.mode));
  r.set_num_prefill_workers(prefill_->healthy_count());
  r.set_num_decode_workers(decode_->healthy_count());
  r.set_max_tokens_cap(options_.limits.max_tokens_cap);
  for (const auto& ep : decode_->Endpoints()) {
    absl::MutexLock lock(&ep->mu);
    if (ep->healthy && !ep->status.model_fingerprint().empty()) {
      r.set_fingerprint(ep->status.model_fingerprint());
      break;
    }
  }
  return r;
}

}  // namespace pdserve
