// Disaggregated clusters (1 prefill + 1 decode worker) on numerics other
// than the default return exactly what `pdserve complete` returns for the
// same requests, greedy and seeded: an int4 GPTQ checkpoint (written at test
// time by tests/unit/quant_checkpoint_writer.py into a temporary directory)
// on the int kernels (--dtype=bf16), and bf16 on AMX tiles
// (PDSERVE_BF16_KERNEL=amx, where the CPU has AMX-BF16).
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

namespace fs = std::filesystem;

// Each prompt, greedy and seeded (temperature 0.9, top_p 0.95, seed 11), 24
// tokens ignoring end-of-sequence: the cluster's output equals `pdserve
// complete`'s with the same model flags.
void ExpectServedEqualsComplete(
    Cluster& cluster, const std::vector<std::string>& model_flags,
    const std::vector<std::vector<int32_t>>& prompts) {
  for (const auto& ids : prompts) {
    for (bool seeded : {false, true}) {
      v1::GenerateRequest req = IdsRequest(ids, 24);
      req.set_ignore_eos(true);
      std::vector<std::string> flags = model_flags;
      flags.push_back("--max_tokens=24");
      flags.push_back("--ignore_eos");
      if (seeded) {
        req.mutable_sampling()->set_temperature(0.9f);
        req.mutable_sampling()->set_top_p(0.95f);
        req.mutable_sampling()->set_seed(11);
        flags.insert(flags.end(),
                     {"--temperature=0.9", "--top_p=0.95", "--seed=11"});
      }
      auto served = RunGenerate(cluster.router(0), req, absl::Seconds(60));
      ASSERT_TRUE(served.ok()) << served.status() << cluster.Logs();
      auto complete = CompleteOutputIds(ids, flags);
      ASSERT_TRUE(complete.ok()) << complete.status();
      EXPECT_EQ(served->output_ids, *complete)
          << "seeded " << seeded << " prompt size " << ids.size();
      EXPECT_EQ(served->output_ids.size(), 24u);
    }
  }
}

TEST(QuantizedService, DisaggregatedGptqInt4EqualsComplete) {
  const std::string dir =
      (fs::temp_directory_path() /
       ("pdserve_quantized_service_" + std::to_string(getpid())))
          .string();
  const std::string python =
      fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  ASSERT_EQ(std::system((python + " tests/unit/quant_checkpoint_writer.py " +
                         dir + " gptq4")
                            .c_str()),
            0)
      << "needs python3-numpy";
  const std::vector<std::string> model_flags = {
      "--model=" + dir, "--dtype=bf16", "--tokenizer=models/stories260K"};
  ClusterOptions o;
  o.common_flags = model_flags;
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ExpectServedEqualsComplete(
      **cluster, model_flags,
      {{1, 5, 9, 14}, {1, 30, 31, 32, 33, 34, 35, 36, 37, 3}, {7}});
  cluster->reset();
  fs::remove_all(dir);
}

TEST(QuantizedService, Bf16OnAmxTilesDisaggregatedEqualsComplete) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("amx-bf16") ||
      std::getenv("PDSERVE_DISABLE_AMX") != nullptr) {
    GTEST_SKIP() << "this CPU has no AMX-BF16 (or PDSERVE_DISABLE_AMX is "
                    "set): the AMX kernel is not exercised here";
  }
  const std::vector<std::string> model_flags = {"--model=models/stories260K",
                                                "--dtype=bf16"};
  ClusterOptions o;
  o.common_flags = model_flags;
  // The default kernel's fingerprint, for comparison.
  std::string default_fingerprint;
  {
    auto plain = Cluster::Start(o);
    ASSERT_TRUE(plain.ok()) << plain.status();
    auto status = (*plain)->Status((*plain)->prefill(0));
    ASSERT_TRUE(status.ok()) << status.status();
    default_fingerprint = status->model_fingerprint();
  }
  // Inherited by the workers and by `pdserve complete`.
  ASSERT_EQ(setenv("PDSERVE_BF16_KERNEL", "amx", 1), 0);
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // The workers really run AMX: their numerics are in the fingerprint.
  for (RoleProcess* worker :
       {&(*cluster)->prefill(0), &(*cluster)->decode(0)}) {
    auto status = (*cluster)->Status(*worker);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_NE(status->model_fingerprint(), default_fingerprint);
  }
  // Up to 40 prompt tokens: prefill products of 16-row tiles and a
  // remainder; decode steps of one row.
  std::vector<int32_t> long_prompt = {1};
  for (int i = 0; i < 39; ++i) long_prompt.push_back(20 + 7 * i);
  ExpectServedEqualsComplete(**cluster, model_flags,
                             {{1, 5, 9, 14}, long_prompt, {7}});
  cluster->reset();
  unsetenv("PDSERVE_BF16_KERNEL");
}

}  // namespace
}  // namespace pdserve::testing
