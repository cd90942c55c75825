// `pdserve generate`: the streaming client of the router.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "common/grpc_util/grpc_util.h"
#include "tools/client/generate_client.h"
#include "tools/common_flags.h"
#include "tools/service_cmds/service_common.h"
#include "tools/subcommand.h"

ABSL_FLAG(int32_t, concurrency, 8,
          "generate --input_jsonl: requests in flight");
ABSL_FLAG(double, timeout_seconds, 600, "generate: deadline of each request");
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
  return v1::Generation::NewStub(
      MakeChannel(absl::GetFlag(FLAGS_target), *creds));
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
  const auto base = RequestFromFlags("", {});
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
  const int n = std::max(1, absl::GetFlag(FLAGS_concurrency));
  for (int t = 0; t < n; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  int rc = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    std::printf("%s\n", out[i].c_str());
    if (failed[i]) rc = 1;
  }
  return rc;
}

int RunGenerateCmd(const std::vector<std::string>& args) {
  auto stub = MakeStub();
  if (!stub.ok()) return FailWith("generate", stub.status());
  const std::string jsonl = absl::GetFlag(FLAGS_input_jsonl);
  if (!jsonl.empty()) return RunJsonl(**stub, jsonl);
  std::vector<std::string> words(args.begin() + (args.empty() ? 0 : 1),
                                 args.end());
  const std::string prompt = absl::StrJoin(words, " ");
  const auto ids = absl::GetFlag(FLAGS_prompt_ids);
  if (prompt.empty() && ids.empty()) {
    std::fprintf(stderr, "pdserve generate: give a PROMPT or --prompt_ids\n");
    return 2;
  }
  auto req = RequestFromFlags(prompt, ids);
  if (!req.ok()) return FailWith("generate", req.status());
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
    return 1;
  }
  if (json) {
    std::printf("%s\n", ResultToJson(*result).dump().c_str());
  } else {
    std::printf("\n");
  }
  return 0;
}

PDSERVE_SUBCOMMAND(
    "generate", "stream a completion from a router",
    "pdserve generate --target=HOST:PORT [--json] [--max_tokens=N] "
    "[--temperature=T] "
    "[--top_p --top_k --min_p --seed --stop --stop_token_ids --ignore_eos "
    "--top_logprobs] PROMPT...\n"
    "pdserve generate --target=HOST:PORT --input_jsonl=FILE [--concurrency=K]",
    RunGenerateCmd);

}  // namespace
}  // namespace pdserve
