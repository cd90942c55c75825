// `pdserve generate`: the streaming client of the router.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_util/grpc_util.h"
#include "common/grpc_util/raw_proto.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "router/http/openai_request.h"
#include "tools/client/generate_client.h"
#include "tools/common_flags.h"
#include "tools/service_cmds/service_common.h"
#include "tools/subcommand.h"

ABSL_FLAG(int32_t, concurrency, 8,
          "generate --input_jsonl: requests in flight");
ABSL_FLAG(double, timeout_seconds, 600, "generate: deadline of each request");
ABSL_FLAG(std::string, chat, "",
          "generate: send this user message as a conversation (rendered with "
          "the router's chat template) instead of a raw prompt");
ABSL_FLAG(std::string, messages_json, "",
          "generate: a conversation from this JSON file: a list of messages "
          "([{\"role\", \"content\"}...]) or an object with \"messages\" and "
          "optionally \"tools\", \"chat_template_kwargs\", "
          "\"add_generation_prompt\", \"continue_final_message\" (the OpenAI "
          "chat request's fields)");
ABSL_FLAG(std::string, tls_ca, "",
          "generate: CA certificate (PEM) to verify a TLS router (empty = "
          "plaintext)");

namespace pdserve {
namespace {

namespace v1 = ::pdserve::v1;

absl::StatusOr<std::unique_ptr<v1::Generation::Stub>> MakeStub() {
  TlsFiles tls;
  tls.ca = absl::GetFlag(FLAGS_tls_ca);
  auto creds = MakeChannelCredentials(tls);
  if (!creds.ok()) return creds.status();
  ASSIGN_OR_RETURN(const std::string target, RouterTargetFromFlags());
  return v1::Generation::NewStub(MakeChannel(target, *creds));
}

// The shared request flags (RequestFromFlags) plus generate's own.
absl::StatusOr<v1::GenerateRequest> GenerateRequestFromFlags(
    const std::string& prompt, const std::vector<std::string>& ids) {
  auto req = RequestFromFlags(prompt, ids);
  if (req.ok() && absl::GetFlag(FLAGS_prompt_logprobs) >= 0) {
    req->set_prompt_logprobs(absl::GetFlag(FLAGS_prompt_logprobs));
  }
  return req;
}

int RunJsonl(v1::Generation::Stub& stub, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "pdserve generate: cannot read %s\n", path.c_str());
    return 1;
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  std::vector<std::string> out(lines.size());
  std::vector<bool> failed(lines.size(), false);
  std::atomic<size_t> next{0};
  const auto base = GenerateRequestFromFlags("", {});
  const absl::Duration timeout =
      absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds));
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < lines.size();) {
      absl::StatusOr<GenerateResult> r;
      auto req = base.ok() ? RequestFromJson(lines[i], *base) : base;
      if (req.ok()) {
        r = RunGenerate(stub, *req, timeout);
      } else {
        r = req.status();
      }
      failed[i] = !r.ok();
      out[i] = (r.ok() ? ResultToJson(*r) : ErrorToJson(r.status())).dump();
    }
  };
  std::vector<std::thread> threads;
  const int n = absl::GetFlag(FLAGS_concurrency);
  for (int t = 0; t < n; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  int rc = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    std::printf("%s\n", out[i].c_str());
    if (failed[i]) rc = 1;
  }
  return rc;
}

// The conversation of --chat or --messages_json, parsed like the body of an
// OpenAI chat request (so the CLI and the HTTP API accept the same shapes).
absl::StatusOr<v1::ChatInput> ChatFromFlags() {
  nlohmann::json body;
  const std::string file = absl::GetFlag(FLAGS_messages_json);
  if (!file.empty()) {
    auto text = ReadFileToString(file);
    if (!text.ok()) return text.status();
    body = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--messages_json: ", file, " is not valid JSON"));
    }
    if (body.is_array()) body = nlohmann::json{{"messages", body}};
  } else {
    body = {{"messages",
             {{{"role", "user"}, {"content", absl::GetFlag(FLAGS_chat)}}}}};
  }
  openai::RequestError error;
  auto parsed = openai::ParseChatRequest(body, &error);
  if (!parsed.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.empty() ? "--chat" : "--messages_json", ": ",
                     error.status.message()));
  }
  return parsed->prompts[0].chat();
}

// Strings must be UTF-8 (protobuf refuses others): say where before sending.
absl::Status CheckUtf8(const std::string& what, const std::string& s) {
  const int64_t at = InvalidUtf8Offset(s);
  if (at < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " is not valid UTF-8 (byte ", at, " is 0x",
      absl::Hex(static_cast<unsigned char>(s[at]), absl::kZeroPad2),
      "); give UTF-8 text or --prompt_ids"));
}

int RunGenerateCmd(const std::vector<std::string>& args) {
  if (!(absl::GetFlag(FLAGS_timeout_seconds) > 0)) {
    return FailWith("generate", absl::InvalidArgumentError(
                                    "--timeout_seconds must be positive"));
  }
  if (absl::GetFlag(FLAGS_concurrency) < 1 ||
      absl::GetFlag(FLAGS_concurrency) > 1024) {
    return FailWith("generate", absl::InvalidArgumentError(
                                    "--concurrency must be 1 to 1024"));
  }
  auto stub = MakeStub();
  if (!stub.ok()) return FailWith("generate", stub.status());
  const std::string jsonl = absl::GetFlag(FLAGS_input_jsonl);
  if (!jsonl.empty()) return RunJsonl(**stub, jsonl);
  // A PROMPT argument, even "" (BOS alone).
  const bool has_text = args.size() > 1;
  std::vector<std::string> words(args.begin() + (args.empty() ? 0 : 1),
                                 args.end());
  const std::string prompt = absl::StrJoin(words, " ");
  const auto ids = absl::GetFlag(FLAGS_prompt_ids);
  const bool chat = !absl::GetFlag(FLAGS_chat).empty() ||
                    !absl::GetFlag(FLAGS_messages_json).empty();
  if (static_cast<int>(has_text) + static_cast<int>(!ids.empty()) +
          static_cast<int>(chat) !=
      1) {
    std::fprintf(stderr,
                 "pdserve generate: give one of PROMPT, --prompt_ids, --chat "
                 "or --messages_json\n");
    return 2;
  }
  if (absl::Status s = CheckUtf8("the prompt", prompt); !s.ok()) {
    return FailWith("generate", s);
  }
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) {
    if (absl::Status s = CheckUtf8("a --stop string", stop); !s.ok()) {
      return FailWith("generate", s);
    }
  }
  if (absl::Status s = CheckUtf8("--chat", absl::GetFlag(FLAGS_chat));
      !s.ok()) {
    return FailWith("generate", s);
  }
  auto req = GenerateRequestFromFlags(prompt, ids);
  if (!req.ok()) return FailWith("generate", req.status());
  if (chat) {
    auto conversation = ChatFromFlags();
    if (!conversation.ok()) return FailWith("generate", conversation.status());
    *req->mutable_chat() = *std::move(conversation);
  }
  const bool json = absl::GetFlag(FLAGS_json);
  auto result = RunGenerate(**stub, *req,
                            absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds)),
                            [json](const std::string& text) {
                              if (json) return;
                              std::fwrite(text.data(), 1, text.size(), stdout);
                              std::fflush(stdout);
                            });
  if (!result.ok()) {
    if (!json) std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "pdserve generate: %s: %s\n",
                 absl::StatusCodeToString(result.status().code()).c_str(),
                 std::string(result.status().message()).c_str());
    if (absl::IsUnavailable(result.status()) &&
        absl::StrContains(result.status().message(), "failed to connect")) {
      std::fprintf(stderr,
                   "pdserve generate: no router answers at --target=%s; "
                   "start one (`pdserve up --port=PORT` runs a local "
                   "cluster) or point --target at a running router\n",
                   absl::GetFlag(FLAGS_target).c_str());
    }
    return 1;
  }
  if (json) {
    std::printf("%s\n", ResultToJson(*result).dump().c_str());
  } else {
    if (!result->text.empty()) std::printf("\n");  // ends the streamed text
    if (!result->prompt_logprobs.empty()) {
      // The prompt's score in a line (--json has every token's): the
      // output itself of a prompt-only request (--max_tokens=0).
      double sum = 0;
      for (const auto& t : result->prompt_logprobs) sum += t.logprob();
      const size_t n = result->prompt_logprobs.size();
      std::fprintf(result->output_ids.empty() ? stdout : stderr,
                   "prompt: %zu tokens scored, log-likelihood %.4f, "
                   "perplexity %.4f (--json lists each token's)\n",
                   n, sum, std::exp(-sum / static_cast<double>(n)));
    }
    if (result->text.empty() && !result->output_ids.empty()) {
      // A router without a tokenizer (synthetic:NAME) streams no text.
      std::fprintf(stderr,
                   "pdserve generate: %zu tokens and no text (the router has "
                   "no tokenizer); --json shows their ids\n",
                   result->output_ids.size());
    }
  }
  return 0;
}

PDSERVE_SUBCOMMAND(
    "generate", "stream a completion from a router",
    "pdserve generate --target=HOST:PORT [--json] [--max_tokens=N] "
    "[--temperature=T] "
    "[--top_p --top_k --min_p --seed --stop --stop_token_ids --ignore_eos "
    "--top_logprobs --prompt_logprobs] (PROMPT... | --prompt_ids=1,2,3 | "
    "--chat=MESSAGE | "
    "--messages_json=FILE)\n"
    "pdserve generate --target=HOST:PORT --input_jsonl=FILE [--concurrency=K]",
    FlagNames({SamplingFlagNames(),
               {"target", "prompt_ids", "input_jsonl", "json",
                "prompt_logprobs"}}),
    RunGenerateCmd);

}  // namespace
}  // namespace pdserve
