// ClientStream: the client side of one Generate call (see the class).
#ifndef PDSERVE_ROUTER_CLIENT_STREAM_H_
#define PDSERVE_ROUTER_CLIENT_STREAM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics/router_metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "pdserve/v1/generate.pb.h"
#include "router/request_builder.h"
#include "router/response_sink.h"
#include "router/stop_matcher.h"

namespace pdserve {

namespace v1 = ::pdserve::v1;

// The client side of one request: detokenizes, applies stop strings, writes
// messages to the request's ResponseSink and records the token metrics (TTFT,
// inter-token gaps, generated tokens). It outlives the attempts of a request,
// so a migrated stream continues seamlessly. Not thread-safe: used by the
// request's actor (router/request_run.h) only.
class ClientStream {
 public:
  ClientStream(ResponseSink* sink, std::string request_id, ResolvedRequest req,
               const Tokenizer* tokenizer, absl::Time arrival,
               metrics::RouterMetrics* metrics);

  // Forwards tokens; false when the client went away. Sets stopped() when a
  // stop string completed (later tokens are dropped).
  bool Send(
      const google::protobuf::RepeatedPtrField<v1::GeneratedToken>& tokens);

  // The final message, with `timings` (e2e is set here), `migrated` and
  // the usage counts of the whole stream.
  bool Finish(const std::string& finish_reason, v1::StageTimings timings);

  // Prompt logprobs for the next message written (Send's or Finish's);
  // none (empty) changes nothing.
  void SetPromptLogprobs(
      const google::protobuf::RepeatedPtrField<v1::GeneratedToken>& scores) {
    if (!scores.empty()) pending_prompt_logprobs_ = scores;
  }

  bool stopped() const { return matcher_.stopped(); }
  bool sent_any() const { return sent_any_; }
  int completion_tokens() const { return completion_tokens_; }
  // Every token id sent to the client so far (a migration resumes after it).
  const std::vector<int32_t>& generated() const { return generated_; }
  void CountMigration() { ++migrations_; }
  int migrations() const { return migrations_; }
  std::optional<double> ttft_seconds() const { return ttft_seconds_; }
  // Set once Finish ran.
  const std::optional<v1::StageTimings>& final_timings() const {
    return final_timings_;
  }
  const std::string& request_id() const { return request_id_; }
  const ResolvedRequest& request() const { return req_; }

 private:
  void TakePromptLogprobs(v1::GenerateResponse* msg);
  // Adds req_.prompt_ids unless msg has them already.
  void AttachPromptIds(v1::GenerateResponse* msg) const;

  ResponseSink* const sink_;
  const std::string request_id_;
  const ResolvedRequest req_;
  std::optional<IncrementalDetokenizer> detok_;
  StopStringMatcher matcher_;
  int completion_tokens_ = 0;
  std::vector<int32_t> generated_;
  int migrations_ = 0;
  bool sent_any_ = false;
  const absl::Time arrival_;
  metrics::RouterMetrics* const metrics_;
  std::optional<absl::Time> last_send_;
  std::optional<double> ttft_seconds_;
  std::optional<v1::StageTimings> final_timings_;
  std::optional<google::protobuf::RepeatedPtrField<v1::GeneratedToken>>
      pending_prompt_logprobs_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_CLIENT_STREAM_H_
