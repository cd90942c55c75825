// pdserve's HTTP API driven by a real third-party client: the official
// OpenAI SDK for Node.js (npm `openai`, pinned in tests/openai/package.json,
// installed by this test with `npm ci`). The cluster serves the bundled model
// with the Llama 2 chat template; the expected outputs come from gRPC and
// `pdserve complete` in this process, and tests/openai/sdk_test.mjs checks
// the SDK sees exactly them. A second test runs 1,000 concurrent streaming
// chat requests (tests/openai/load_test.mjs) and reports the router's
// thread count and peak RSS, which must stay bounded. (The other npm client
// of the field's users, @grpc/grpc-js: service_grpc_js_test.cc.)

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
#include "tests/integration/node_client.h"

namespace pdserve::testing {
namespace {

using nlohmann::json;

constexpr char kChatTemplate[] = "models/chat_templates/llama2.jinja";

absl::Status InstallSdk() { return InstallNpmPackages("tests/openai"); }

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

}  // namespace
}  // namespace pdserve::testing
