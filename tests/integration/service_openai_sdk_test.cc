// pdserve's HTTP API driven by a real third-party client: the official
// OpenAI SDK for Node.js (npm `openai`, pinned in tests/openai/package.json,
// installed by this test with `npm ci`). The cluster serves the bundled model
// with the Llama 2 chat template; the expected outputs come from gRPC and
// `pdserve complete` in this process, and tests/openai/sdk_test.mjs checks
// the SDK sees exactly them. A second test runs 1,000 concurrent streaming
// chat requests (tests/openai/load_test.mjs) and reports the router's
// thread count and peak RSS, which must stay bounded. A third drives the
// public gRPC API from Node.js's @grpc/grpc-js (tests/grpc_js/): the two npm
// clients the field's users have.

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

using nlohmann::json;

constexpr char kChatTemplate[] = "models/chat_templates/llama2.jinja";

// Installs DIR/node_modules (npm ci, pinned by DIR/package-lock.json)
// once. The check and the install both run under a lock, and a marker is
// written only after npm ci succeeded: a parallel test never sees a
// half-installed tree, and never has one deleted under it by a second npm ci.
absl::Status InstallNpmPackages(const std::string& dir) {
  const int rc =
      std::system(absl::StrCat("cd ", dir,
                               " && flock package.json sh -c '"
                               "test -f node_modules/.pdserve-installed || "
                               "(npm ci --no-audit --no-fund --loglevel=error "
                               ">/dev/null 2>&1 && "
                               "touch node_modules/.pdserve-installed)'")
                      .c_str());
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("npm ci in ", dir,
                     " failed (needs the npm registry; "
                     "scripts/install_deps.sh installs node and npm)"));
  }
  return absl::OkStatus();
}
absl::Status InstallSdk() { return InstallNpmPackages("tests/openai"); }

// Runs `node SCRIPT ARGS...` (SCRIPT under tests/openai/ unless it names a
// folder) and returns its exit code; its output is printed (it is the
// test's report).
int RunNode(const std::string& script, const std::vector<std::string>& args,
            std::string* output) {
  std::string cmd = absl::StrCat(
      "node ", absl::StrContains(script, "/") ? "" : "tests/openai/", script);
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  absl::StrAppend(&cmd, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// "Threads:" and "VmHWM:" (kB) of a process.
std::pair<int, int64_t> ThreadsAndPeakRss(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  int threads = 0;
  int64_t hwm_kb = 0;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, "Threads:")) {
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &threads);
    } else if (absl::ConsumePrefix(&v, "VmHWM:")) {
      (void)absl::SimpleAtoi(
          absl::StripSuffix(absl::StripAsciiWhitespace(v), " kB"), &hwm_kb);
    }
  }
  return {threads, hwm_kb};
}

TEST(OpenAiSdkTest, OfficialClientSeesWhatGrpcAndCompleteReturn) {
  ASSERT_TRUE(InstallSdk().ok()) << InstallSdk();
  ClusterOptions o;
  o.decode = 2;
  o.router_flags = {absl::StrCat("--chat_template=", kChatTemplate)};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  // A router that is full at once, for the 429 check.
  ClusterOptions small;
  small.router_flags = {"--max_in_flight=1", "--admission_queue=0",
                        "--retry_after_ms=250"};
  auto overload = Cluster::Start(small);
  ASSERT_TRUE(overload.ok()) << overload.status();

  json expect;
  expect["model"] = "stories260K";
  expect["retry_after_ms"] = "250";  // the overloaded router's hint
  // The chat case: the rendered prompt's ids from the router (gRPC
  // Tokenize with messages), exactly one BOS, and complete's output on them.
  const json messages =
      json::array({{{"role", "system"}, {"content", "You tell short stories."}},
                   {{"role", "user"}, {"content", "Tell me about a cat."}}});
  v1::TokenizeRequest treq;
  for (const json& m : messages) {
    auto* msg = treq.mutable_chat()->add_messages();
    msg->set_role(m["role"]);
    msg->set_content(m["content"]);
  }
  grpc::ClientContext tctx;
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(c.router().Tokenize(&tctx, treq, &tresp).ok());
  std::vector<int32_t> chat_ids(tresp.ids().begin(), tresp.ids().end());
  ASSERT_FALSE(chat_ids.empty());
  EXPECT_EQ(chat_ids[0], 1) << "the rendered prompt starts with BOS";
  EXPECT_EQ(std::count(chat_ids.begin(), chat_ids.end(), 1), 1)
      << "exactly one BOS: " << tresp.rendered();
  const int chat_max_tokens = 24;
  auto complete = RunPdserveCapture(
      {"complete", absl::StrCat("--prompt_ids=", absl::StrJoin(chat_ids, ",")),
       absl::StrCat("--max_tokens=", chat_max_tokens), "--json"},
      absl::Seconds(60));
  ASSERT_TRUE(complete.ok()) << complete.status();
  const json done = json::parse(*complete);
  expect["chat"] = {
      {"messages", messages},
      {"max_tokens", chat_max_tokens},
      {"prompt_tokens", chat_ids.size()},
      {"output_ids", done["output_ids"]},
      {"text", done["text"]},
      {"finish_reason", done["finish_reason"] == "length" ? "length" : "stop"}};
  // The plain completion: the first reference case.
  const ReferenceCase ref = LoadReferenceCases().front();
  expect["completion"] = {{"prompt_ids", ref.prompt_ids},
                          {"max_tokens", ref.max_new_tokens},
                          {"output_ids", ref.output_ids}};
  // Seeded sampling over gRPC.
  v1::GenerateRequest seeded;
  seeded.set_text("The little bird");
  seeded.set_max_tokens(30);
  seeded.mutable_sampling()->set_temperature(0.8f);
  seeded.mutable_sampling()->set_top_p(0.9f);
  seeded.mutable_sampling()->set_seed(7);
  auto g = RunGenerate(c.router(), seeded, absl::Seconds(60));
  ASSERT_TRUE(g.ok()) << g.status();
  expect["seeded"] = {{"prompt", "The little bird"},
                      {"max_tokens", 30},
                      {"temperature", 0.8},
                      {"top_p", 0.9},
                      {"seed", 7},
                      {"text", g->text}};

  TempDir dir;
  const std::string expect_file = dir.path() + "/expect.json";
  std::ofstream(expect_file) << expect.dump(1);
  std::string output;
  const int rc = RunNode(
      "sdk_test.mjs",
      {absl::StrCat(
           "--base_url=http://127.0.0.1:", c.router_process().http_port, "/v1"),
       absl::StrCat("--expect=", expect_file),
       absl::StrCat("--overload_url=http://127.0.0.1:",
                    (*overload)->router_process().http_port, "/v1")},
      &output);
  std::printf("%s", output.c_str());
  EXPECT_EQ(rc, 0) << output;
  EXPECT_TRUE(c.WaitForNoKvInUse(absl::Seconds(10)).ok());
}

TEST(OpenAiSdkTest, ThousandConcurrentStreamsCompleteWithBoundedThreads) {
  ASSERT_TRUE(InstallSdk().ok()) << InstallSdk();
  ClusterOptions o;
  o.decode = 2;
  // The router runs 256 at a time and queues the rest (admission FIFO); the
  // workers' own queues are sized for what the router sends them.
  o.router_flags = {absl::StrCat("--chat_template=", kChatTemplate),
                    "--max_in_flight=256", "--admission_timeout=300s"};
  o.decode_flags = {"--max_num_seqs=64", "--max_waiting_seqs=512"};
  o.prefill_flags = {"--max_prefill_queue=512"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const int router_pid = c.router_process().proc.pid();
  const auto [threads_before, rss_before] = ThreadsAndPeakRss(router_pid);
  std::atomic<bool> done{false};
  std::atomic<int> max_threads{0};
  std::thread watcher([&] {
    while (!done.load()) {
      max_threads.store(
          std::max(max_threads.load(), ThreadsAndPeakRss(router_pid).first));
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  std::string output;
  const int rc = RunNode("load_test.mjs",
                         {absl::StrCat("--base_url=http://127.0.0.1:",
                                       c.router_process().http_port, "/v1"),
                          "--model=stories260K", "--n=1000", "--max_tokens=8"},
                         &output);
  done.store(true);
  watcher.join();
  const auto [threads_after, rss_after_kb] = ThreadsAndPeakRss(router_pid);
  std::printf("%s", output.c_str());
  std::printf(
      "router: threads %d before, at most %d during 1000 streams; peak RSS "
      "%.1f MiB (%.1f MiB before)\n",
      threads_before, max_threads.load(), rss_after_kb / 1024.0,
      rss_before / 1024.0);
  EXPECT_EQ(rc, 0) << output;
  // No thread per stream: a few dozen threads whatever the load.
  EXPECT_LT(max_threads.load(), 100);
  EXPECT_TRUE(c.WaitForNoKvInUse(absl::Seconds(20)).ok());
}

// The public gRPC API driven by @grpc/grpc-js (pinned in
// tests/grpc_js/package.json, installed with npm ci), which loads
// generate.proto at run time: the reference outputs, a text prompt and
// seeded sampling as the C++ client sees them, statuses with pdserve's
// messages, a cancelled stream, and the retry hint of an overloaded router
// in the trailers (tests/grpc_js/grpc_test.mjs).
TEST(GrpcJsTest, NodeClientSeesWhatTheReferenceAndTheCppClientSee) {
  ASSERT_TRUE(InstallNpmPackages("tests/grpc_js").ok())
      << InstallNpmPackages("tests/grpc_js");
  ClusterOptions o;
  // 5 ms a token: a 400-token stream is still running when it is cancelled.
  o.decode_flags = {"--testonly_stream_delay_ms=5"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  ClusterOptions small = o;
  small.router_flags = {"--max_in_flight=1", "--admission_queue=0",
                        "--retry_after_ms=250"};
  auto overload = Cluster::Start(small);
  ASSERT_TRUE(overload.ok()) << overload.status();

  json expect;
  expect["model"] = "models/stories260K";  // the harness's --model
  expect["retry_after_ms"] = "250";
  const std::vector<ReferenceCase> refs = LoadReferenceCases();
  for (const ReferenceCase& ref : refs) {
    expect["references"].push_back({{"prompt_ids", ref.prompt_ids},
                                    {"max_new_tokens", ref.max_new_tokens},
                                    {"output_ids", ref.output_ids}});
  }
  v1::GenerateRequest text;
  text.set_text("Once upon a time");
  text.set_max_tokens(20);
  text.mutable_sampling()->set_temperature(0);
  auto t = RunGenerate(c.router(), text, absl::Seconds(60));
  ASSERT_TRUE(t.ok()) << t.status();
  expect["text"] = {{"prompt", text.text()},
                    {"max_tokens", text.max_tokens()},
                    {"prompt_ids", t->prompt_ids},
                    {"ids", t->output_ids},
                    {"text", t->text}};
  v1::GenerateRequest seeded = IdsRequest(refs[1].prompt_ids, 30);
  seeded.mutable_sampling()->set_temperature(0.8f);
  seeded.mutable_sampling()->set_top_p(0.9f);
  seeded.mutable_sampling()->set_seed(7);
  auto g = RunGenerate(c.router(), seeded, absl::Seconds(60));
  ASSERT_TRUE(g.ok()) << g.status();
  expect["seeded"] = {{"prompt_ids", refs[1].prompt_ids},
                      {"max_tokens", 30},
                      {"temperature", 0.8},
                      {"top_p", 0.9},
                      {"seed", 7},
                      {"ids", g->output_ids}};

  TempDir dir;
  const std::string expect_file = dir.path() + "/expect.json";
  std::ofstream(expect_file) << expect.dump(1);
  std::string output;
  const int rc =
      RunNode("tests/grpc_js/grpc_test.mjs",
              {absl::StrCat("--target=", c.router_process().address()),
               "--proto=proto/pdserve/v1/generate.proto",
               absl::StrCat("--expect=", expect_file),
               absl::StrCat("--overload_target=",
                            (*overload)->router_process().address())},
              &output);
  std::printf("%s", output.c_str());
  EXPECT_EQ(rc, 0) << output;
  // The cancelled stream and the refused ones left nothing behind.
  EXPECT_TRUE(c.WaitForNoKvInUse(absl::Seconds(10)).ok()) << c.Logs();
  EXPECT_TRUE((*overload)->WaitForNoKvInUse(absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace pdserve::testing
