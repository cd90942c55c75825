// Fuzz test (deterministic seeds) of the chat template engine: random token
// soup from the grammar's pieces, and random mutations of the real templates
// under tests/data/chat_templates/, rendered over random conversations. Every
// parse and render must end with OK or INVALID_ARGUMENT (never a crash, a
// hang or another code), give valid UTF-8, and render identically twice.
// Also built and run under AddressSanitizer + UBSan by
// tests/unit/asan_test.sh (CTest: chat_template_fuzz_asan, label "asan").
//
// PDSERVE_FUZZ_SCALE (default 1) multiplies the iteration counts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/chat_template/chat_template.h"
#include "common/chat_template/text.h"
#include "gtest/gtest.h"
#include "tests/unit/chat_template_test_util.h"

namespace pdserve {
namespace {

using nlohmann::ordered_json;
using testing_util::kChatTemplateData;
using testing_util::ReadText;

int Scale() {
  const char* s = std::getenv("PDSERVE_FUZZ_SCALE");
  return s != nullptr ? std::max(1, std::atoi(s)) : 1;
}

// Pieces of Jinja2 syntax and text, so random sequences reach deep into the
// parser and the evaluator.
const std::vector<std::string>& Pieces() {
  static const std::vector<std::string> p = {
      "{{",
      "}}",
      "{{-",
      "-}}",
      "{%",
      "%}",
      "{%-",
      "-%}",
      "{%+",
      "+%}",
      "{#",
      "#}",
      "{% raw %}",
      "{% endraw %}",
      "if ",
      "elif ",
      "else",
      "endif",
      "for ",
      " in ",
      "endfor",
      "set ",
      "endset",
      "macro ",
      "endmacro",
      "call ",
      "endcall",
      "filter ",
      "endfilter",
      "with ",
      "endwith",
      "break",
      "continue",
      "recursive",
      "generation",
      "endgeneration",
      "block b",
      "endblock",
      "print ",
      "include 'x'",
      "loop",
      "loop.index",
      "loop.last",
      "loop.previtem",
      "loop.cycle(1, 2)",
      "loop(x)",
      "caller()",
      "varargs",
      "kwargs",
      "messages",
      "message",
      "m",
      "x",
      "y",
      "ns",
      "tools",
      "bos_token",
      "add_generation_prompt",
      "namespace(a=1)",
      "ns.a",
      "range(",
      "range(3)",
      "range(100000)",
      "dict(a=1)",
      "raise_exception('boom')",
      "strftime_now('%Y')",
      "(",
      ")",
      "[",
      "]",
      "{",
      "}",
      ",",
      ":",
      ".",
      "|",
      "~",
      "+",
      "-",
      "*",
      "/",
      "//",
      "%",
      "**",
      "==",
      "!=",
      "<",
      ">=",
      " is ",
      " not ",
      " and ",
      " or ",
      "defined",
      "none",
      "true",
      "false",
      "string",
      "mapping",
      "iterable",
      "odd",
      "divisibleby 2",
      "sameas",
      "'str'",
      "\"q\\n\"",
      "'\\u00e9'",
      "''",
      "0",
      "1",
      "-1",
      "2.5",
      "1e308",
      "10**9",
      "2**62",
      "'a' * ",
      "[1, 2, 3]",
      "{'k': 'v'}",
      "(1,)",
      "[::-1]",
      "[1:]",
      "[-1]",
      "['role']",
      ".role",
      ".content",
      ".get('x')",
      ".items()",
      ".keys()",
      ".split()",
      ".strip()",
      ".format(1)",
      ".upper()",
      ".append(1)",
      ".__class__",
      "|tojson",
      "|tojson(indent=2)",
      "|trim",
      "|length",
      "|join(', ')",
      "|map(attribute='role')",
      "|select('odd')",
      "|selectattr('role', 'equalto', 'user')",
      "|list",
      "|first",
      "|last",
      "|sort",
      "|reverse",
      "|unique",
      "|dictsort",
      "|items",
      "|default('d')",
      "|int",
      "|float",
      "|string",
      "|round(2)",
      "|indent(4)",
      "|truncate(5)",
      "|batch(2)",
      "|sum",
      "|min",
      "|max",
      "|e",
      "|safe",
      "|replace('a', 'b')",
      "|center(9)",
      "|wordcount",
      "|nosuch",
      "\n",
      " ",
      "  ",
      "\t",
      "hello",
      "é",
      "😀",
      "今天",
      "<|im_start|>",
      "%",
      "'%s' % ",
      "*",
      "**kwargs",
      "=",
      "a=1"};
  return p;
}

std::string TokenSoup(std::mt19937& rng) {
  std::string s;
  const int n = 1 + rng() % 40;
  for (int i = 0; i < n; ++i) s += Pieces()[rng() % Pieces().size()];
  return s;
}

std::string Mutate(std::string s, std::mt19937& rng) {
  const int edits = 1 + rng() % 3;
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t a = rng() % s.size();
    const size_t len = 1 + rng() % std::min<size_t>(40, s.size() - a);
    switch (rng() % 6) {
      case 0:  // delete
        s.erase(a, len);
        break;
      case 1:  // duplicate
        s.insert(a, s.substr(a, len));
        break;
      case 2:  // insert a piece
        s.insert(a, Pieces()[rng() % Pieces().size()]);
        break;
      case 3:  // move a range
      {
        const std::string part = s.substr(a, len);
        s.erase(a, len);
        s.insert(rng() % (s.size() + 1), part);
        break;
      }
      case 4:  // truncate
        s.resize(a);
        break;
      default:  // overwrite a byte (may break UTF-8: Parse must refuse)
        s[a] = static_cast<char>(rng() % 256);
        break;
    }
  }
  return s;
}

ordered_json RandomValue(std::mt19937& rng, int depth) {
  switch (rng() % (depth > 2 ? 5 : 7)) {
    case 0:
      return nullptr;
    case 1:
      return static_cast<int>(rng() % 2000) - 1000;
    case 2:
      return (rng() % 1000) / 8.0;
    case 3:
      return rng() % 2 == 0;
    case 4: {
      static const char* kText[] = {
          "",   " Hi ",         "x",       "é😀",  "<think>a</think>b",
          "\n", "line1\nline2", "{{ x }}", "tool"};
      return kText[rng() % 9];
    }
    case 5: {
      ordered_json a = ordered_json::array();
      for (int i = rng() % 4; i > 0; --i)
        a.push_back(RandomValue(rng, depth + 1));
      return a;
    }
    default: {
      static const char* kKeys[] = {"type",    "text",     "name",      "role",
                                    "content", "function", "arguments", "x"};
      ordered_json o = ordered_json::object();
      for (int i = rng() % 4; i > 0; --i) {
        o[kKeys[rng() % 8]] = RandomValue(rng, depth + 1);
      }
      return o;
    }
  }
}

ChatTemplateInput RandomInput(std::mt19937& rng) {
  static const char* kRoles[] = {"user", "assistant", "system", "tool",
                                 "other"};
  ChatTemplateInput in;
  in.messages = ordered_json::array();
  for (int i = rng() % 6; i > 0; --i) {
    ordered_json m = {{"role", kRoles[rng() % 5]}};
    if (rng() % 4 != 0) {
      static const char* kText[] = {
          "Hello",     " padded ", "", "é😀 今天", "<think>r</think>answer",
          "two\nlines"};
      m["content"] = kText[rng() % 6];
    } else if (rng() % 4 != 0) {
      m["content"] = RandomValue(rng, 1);
    }
    if (rng() % 6 == 0) {
      m["tool_calls"] = ordered_json::array(
          {{{"type", "function"},
            {"id", "abcdefghi"},
            {"function",
             {{"name", "f"}, {"arguments", RandomValue(rng, 2)}}}}});
    }
    in.messages.push_back(std::move(m));
  }
  if (rng() % 3 == 0) {
    in.tools = ordered_json::parse(
        R"([{"type": "function", "function": {"name": "get", "description": "d",
             "parameters": {"type": "object",
                            "properties": {"a": {"type": "string"}}}}}])");
  }
  in.add_generation_prompt = rng() % 2 == 0;
  in.continue_final_message = !in.add_generation_prompt && rng() % 4 == 0;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  if (rng() % 3 == 0) in.kwargs = {{"x", RandomValue(rng, 1)}, {"y", 1}};
  in.now = 1721995200;
  return in;
}

// Small limits keep each render short; a few renders use the defaults.
ChatTemplateLimits FuzzLimits() {
  ChatTemplateLimits limits;
  limits.max_steps = 100000;
  limits.max_string_bytes = 1 << 20;
  limits.max_items = 100000;
  return limits;
}

struct Stats {
  int parsed = 0;
  int rendered = 0;
  int render_errors = 0;
  double slowest_ms = 0;
};

void Check(const std::string& source, std::mt19937& rng, bool default_limits,
           Stats* stats) {
  auto t = ChatTemplate::Parse(source, "fuzz.jinja");
  if (!t.ok()) {
    ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument)
        << t.status() << "\n"
        << source;
    return;
  }
  ++stats->parsed;
  const ChatTemplateInput in = RandomInput(rng);
  const ChatTemplateLimits limits =
      default_limits ? ChatTemplateLimits() : FuzzLimits();
  const auto start = std::chrono::steady_clock::now();
  auto out = (*t)->Render(in, limits);
  stats->slowest_ms =
      std::max(stats->slowest_ms, std::chrono::duration<double, std::milli>(
                                      std::chrono::steady_clock::now() - start)
                                      .count());
  if (!out.ok()) {
    ++stats->render_errors;
    ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument)
        << out.status() << "\n"
        << source;
    return;
  }
  ++stats->rendered;
  ASSERT_TRUE(jinja::IsValidUtf8(*out)) << source;
  auto again = (*t)->Render(in, limits);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << source;
  ASSERT_EQ(*again, *out) << source;
}

std::vector<std::string> RealTemplates() {
  std::vector<std::string> out;
  for (const char* dir : {"/templates", "/templates_extra"}) {
    for (const auto& entry : std::filesystem::directory_iterator(
             std::string(kChatTemplateData) + dir)) {
      if (entry.path().extension() == ".jinja") {
        out.push_back(ReadText(entry.path().string()));
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ChatTemplateFuzz, TokenSoup) {
  std::mt19937 rng(1234);
  Stats stats;
  const int iterations = 20000 * Scale();
  for (int i = 0; i < iterations; ++i) {
    Check(TokenSoup(rng), rng, i % 1000 == 0, &stats);
    if (HasFatalFailure()) return;
  }
  std::printf(
      "token soup: %d templates, %d parsed, %d rendered, %d render errors, "
      "slowest render %.1f ms\n",
      iterations, stats.parsed, stats.rendered, stats.render_errors,
      stats.slowest_ms);
}

TEST(ChatTemplateFuzz, MutatedRealTemplates) {
  const std::vector<std::string> templates = RealTemplates();
  ASSERT_GE(templates.size(), 20u);
  std::mt19937 rng(5678);
  Stats stats;
  const int iterations = 15000 * Scale();
  for (int i = 0; i < iterations; ++i) {
    const std::string& base = templates[rng() % templates.size()];
    Check(i % 10 == 0 ? base : Mutate(base, rng), rng, i % 500 == 0, &stats);
    if (HasFatalFailure()) return;
  }
  std::printf(
      "mutations: %d templates, %d parsed, %d rendered, %d render errors, "
      "slowest render %.1f ms\n",
      iterations, stats.parsed, stats.rendered, stats.render_errors,
      stats.slowest_ms);
  EXPECT_GT(stats.rendered, iterations / 20);  // mutations reach the evaluator
}

}  // namespace
}  // namespace pdserve
