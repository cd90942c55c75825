// The public gRPC API driven by a real third-party client: Node.js's
// @grpc/grpc-js (pinned in tests/grpc_js/package.json, installed by this
// test with `npm ci`), which loads proto/pdserve/v1/generate.proto at run
// time, as the field's Node.js users do. What it must see is computed here
// with the C++ client (tests/grpc_js/grpc_test.mjs checks it).
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/node_client.h"

namespace pdserve::testing {
namespace {

using nlohmann::json;

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
