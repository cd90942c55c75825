// Chat input over gRPC through a real cluster (issue 13): the router renders
// a conversation with the chat template and tokenizes it without adding
// special tokens (exactly one BOS, the template's), the output equals
// `pdserve complete` on those ids in both modes, a template's
// raise_exception arrives as INVALID_ARGUMENT with its message, a model
// without a template refuses chat requests, a template that does not parse
// stops the router at start-up, and the empty prompt "" generates from BOS
// alone on every path.
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kLlama2[] = "models/chat_templates/llama2.jinja";
constexpr char kGemma[] =
    "tests/data/chat_templates/templates/google-gemma-2-2b-it.jinja";

v1::ChatInput Conversation() {
  v1::ChatInput chat;
  auto* system = chat.add_messages();
  system->set_role("system");
  system->set_content("You tell short stories.");
  auto* user = chat.add_messages();
  user->set_role("user");
  user->set_content("Tell me about a little dog.");
  return chat;
}

TEST(ChatTest, RenderedWithOneBosAndEqualToCompleteInBothModes) {
  ClusterOptions o;
  o.modes = {"disaggregated", "colocated"};
  o.router_flags = {absl::StrCat("--chat_template=", kLlama2)};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;

  // The router's rendering equals `pdserve render-chat` offline.
  v1::TokenizeRequest treq;
  *treq.mutable_chat() = Conversation();
  grpc::ClientContext tctx;
  v1::TokenizeResponse tok;
  ASSERT_TRUE(c.router().Tokenize(&tctx, treq, &tok).ok());
  std::vector<int32_t> ids(tok.ids().begin(), tok.ids().end());
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1)
      << "double BOS in: " << tok.rendered();
  EXPECT_THAT(tok.rendered(), ::testing::StartsWith("<s>[INST] <<SYS>>"));
  TempDir dir;
  const std::string in = dir.path() + "/conv.jsonl";
  std::ofstream(in)
      << nlohmann::json{{"messages",
                         {{{"role", "system"},
                           {"content", "You tell short stories."}},
                          {{"role", "user"},
                           {"content", "Tell me about a little dog."}}}},
                        {"bos_token", "<s>"},
                        {"eos_token", "</s>"}}
             .dump()
      << "\n";
  auto offline = RunPdserveCapture(
      {"render-chat", absl::StrCat("--chat_template=", kLlama2),
       "--tokenizer=models/stories260K", absl::StrCat("--input_jsonl=", in)},
      absl::Seconds(30));
  ASSERT_TRUE(offline.ok()) << offline.status();
  const nlohmann::json line = nlohmann::json::parse(*offline);
  EXPECT_EQ(line["rendered"], tok.rendered());
  EXPECT_EQ(line["ids"].get<std::vector<int32_t>>(), ids);

  // Greedy and seeded: the same ids as `pdserve complete` on the rendered
  // ids, in both modes.
  for (const bool seeded : {false, true}) {
    std::vector<std::string> flags = {"--max_tokens=24"};
    if (seeded) {
      flags.insert(flags.end(), {"--temperature=0.8", "--seed=11"});
    }
    auto expected = CompleteOutputIds(ids, flags);
    ASSERT_TRUE(expected.ok()) << expected.status();
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(absl::StrCat(seeded ? "seeded" : "greedy", " router ", r));
      v1::GenerateRequest req;
      *req.mutable_chat() = Conversation();
      req.set_max_tokens(24);
      req.mutable_sampling()->set_temperature(seeded ? 0.8f : 0.0f);
      if (seeded) req.mutable_sampling()->set_seed(11);
      auto g = RunGenerate(c.router(r), req, absl::Seconds(60));
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ(g->prompt_ids, ids);
      EXPECT_EQ(g->output_ids, *expected);
    }
  }
  // The template's own error (Llama 2 requires alternating roles).
  v1::GenerateRequest bad;
  for (int i = 0; i < 2; ++i) {
    auto* m = bad.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("hello");
  }
  auto refused = RunGenerate(c.router(), bad, absl::Seconds(30));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("Conversation roles must alternate"));
  EXPECT_TRUE(c.WaitForNoKvInUse(absl::Seconds(10)).ok());
}

TEST(ChatTest, GemmaRefusesASystemRoleWithItsMessage) {
  ClusterOptions o;
  o.router_flags = {absl::StrCat("--chat_template=", kGemma)};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  v1::GenerateRequest req;
  *req.mutable_chat() = Conversation();  // has a system message
  auto r = RunGenerate((*cluster)->router(), req, absl::Seconds(30));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "System role not supported");
}

TEST(ChatTest, WithoutATemplateChatIsRefusedAndTextStillWorks) {
  ClusterOptions o;  // stories260K has no chat template
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  v1::GenerateRequest req;
  *req.mutable_chat() = Conversation();
  auto r = RunGenerate((*cluster)->router(), req, absl::Seconds(30));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--chat_template"));
  v1::GenerateRequest text;
  text.set_text("Once upon a time");
  text.set_max_tokens(4);
  EXPECT_TRUE(RunGenerate((*cluster)->router(), text, absl::Seconds(30)).ok());
}

TEST(ChatTest, RouterRefusesToStartWithATemplateThatDoesNotParse) {
  TempDir dir;
  const std::string bad = dir.path() + "/bad.jinja";
  std::ofstream(bad)
      << "{{ bos_token }}\n{% for m in messages %}\n{{ m.content "
         "}\n{% endfor %}\n";
  auto router =
      StartRole({"router",
                 {"--decode_workers=127.0.0.1:1", "--mode=colocated",
                  "--http_port=0", absl::StrCat("--chat_template=", bad)}},
                "router", dir.path());
  ASSERT_FALSE(router.ok());
  EXPECT_THAT(std::string(router.status().message()),
              HasSubstr(absl::StrCat(bad, ":3")));
}

TEST(ChatTest, EmptyPromptIsBosAloneOnEveryPath) {
  auto expected = CompleteOutputIds({1}, {"--max_tokens=12"});
  ASSERT_TRUE(expected.ok()) << expected.status();
  // `pdserve complete ""`.
  auto complete = RunPdserveCapture(
      {"complete", "", "--max_tokens=12", "--json"}, absl::Seconds(60));
  ASSERT_TRUE(complete.ok()) << complete.status();
  const nlohmann::json c = nlohmann::json::parse(*complete);
  EXPECT_EQ(c["prompt_ids"], nlohmann::json::array({1}));
  EXPECT_EQ(c["output_ids"].get<std::vector<int32_t>>(), *expected);
  // gRPC, disaggregated and colocated.
  ClusterOptions o;
  o.modes = {"disaggregated", "colocated"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (int r = 0; r < 2; ++r) {
    v1::GenerateRequest req;
    req.set_text("");
    req.set_max_tokens(12);
    req.mutable_sampling()->set_temperature(0);
    auto g = RunGenerate((*cluster)->router(r), req, absl::Seconds(30));
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->prompt_ids, std::vector<int32_t>({1})) << r;
    EXPECT_EQ(g->output_ids, *expected) << r;
  }
}

}  // namespace
}  // namespace pdserve::testing
