#include "tools/common_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"

ABSL_FLAG(std::string, model, "models/stories260K",
          "Hugging Face model directory, or synthetic:NAME (llama-110m, "
          "llama-1b, llama3-8b) for random weights at a real shape");
ABSL_FLAG(std::string, dtype, "f32", "weight/compute dtype: f32 or bf16");
ABSL_FLAG(std::string, quantization, "none",
          "quantize the linear layers at load (CPU only): none, int8 or int4, "
          "optionally -g32|-g64|-g128 (group size along K) or -pc (one "
          "group per output channel; int8's default, int4's is -g128) and "
          "-asym (zero points), e.g. int8-g32 or int4-g32 (the Q8_0 and "
          "Q4_0 layouts). "
          "With --dtype=bf16 the int8/int4 kernels run; with f32 the weights "
          "take their quantized values in f32 (reference numerics). "
          "GPTQ/AWQ checkpoints are read as quantized whatever this says");
ABSL_FLAG(std::string, kv_dtype, "auto",
          "KV cache dtype: auto (= --dtype), f32 or bf16");
ABSL_FLAG(std::string, kv_cache_memory, "256MiB",
          "KV cache budget: bytes (e.g. 512MiB, 2GiB) or a fraction below 1 "
          "of the memory available to the process (e.g. 0.2; MemAvailable, "
          "capped by a container's cgroup limit); more than is available is "
          "refused");
ABSL_FLAG(int32_t, block_size, 16, "KV cache block size in tokens");
ABSL_FLAG(int32_t, threads, 0,
          "compute threads of each worker (0 = all cores; `up`: the cores "
          "split over its workers, 2 each where that would leave one)");
ABSL_FLAG(int32_t, max_num_seqs, 64, "maximum sequences in one decode batch");
ABSL_FLAG(int32_t, prefill_chunk_tokens, 512,
          "tokens of one prompt computed per forward pass at most (0 = no "
          "limit): long prompts are prefilled in chunks so that other "
          "requests join the next pass (output is identical)");
ABSL_FLAG(std::string, device, "cpu", "compute device: cpu or cuda");
ABSL_FLAG(bool, prefix_caching, true,
          "reuse cached KV blocks of prompts sharing a prefix (exact)");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json, or a directory holding it (default \"\": the "
          "--model directory's tokenizer)");

ABSL_FLAG(std::string, chat_template, "",
          "chat template file (default: the model's tokenizer_config.json "
          "chat_template)");

ABSL_FLAG(int32_t, max_tokens, 64,
          "maximum tokens to generate (0 with --prompt_logprobs: score the "
          "prompt alone)");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature (0 = greedy)");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling probability mass, in (0, 1]");
ABSL_FLAG(int32_t, top_k, 0, "keep the k most likely tokens (0 = off)");
ABSL_FLAG(double, min_p, 0.0, "drop tokens below min_p x the top probability");
ABSL_FLAG(double, repetition_penalty, 1.0, "HF repetition penalty (1 = off)");
ABSL_FLAG(double, presence_penalty, 0.0, "OpenAI presence penalty");
ABSL_FLAG(double, frequency_penalty, 0.0, "OpenAI frequency penalty");
ABSL_FLAG(int64_t, seed, 0,
          "random seed for sampling (bench: also of its dataset and arrivals)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past end-of-sequence ids");
ABSL_FLAG(int32_t, top_logprobs, 0,
          "return the K most likely tokens per position");
ABSL_FLAG(int32_t, prompt_logprobs, -1,
          "score the prompt: each prompt token's logprob given the ones "
          "before it, its rank, and the K most likely alternatives (-1 = "
          "off)");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings (comma-separated)");
ABSL_FLAG(std::vector<std::string>, stop_token_ids, {},
          "extra stop token ids (comma-separated)");
ABSL_FLAG(std::vector<std::string>, prompt_ids, {},
          "prompt as token ids (comma-separated)");

ABSL_FLAG(std::string, target, "localhost:50051",
          "router address HOST:PORT (clients: generate, bench)");

ABSL_FLAG(bool, json, false, "print results as JSON");
ABSL_FLAG(std::string, input_jsonl, "",
          "read one request per line from this JSONL file");

namespace pdserve {

std::vector<std::string> EngineFlagNames() {
  return {"model",    "dtype",           "quantization",
          "kv_dtype", "kv_cache_memory", "block_size",
          "threads",  "device",          "prefix_caching"};
}

std::vector<std::string> SamplingFlagNames() {
  return {"max_tokens",
          "temperature",
          "top_p",
          "top_k",
          "min_p",
          "repetition_penalty",
          "presence_penalty",
          "frequency_penalty",
          "seed",
          "ignore_eos",
          "top_logprobs",
          "stop",
          "stop_token_ids"};
}

absl::StatusOr<std::string> RouterTargetFromFlags() {
  const std::string target = absl::GetFlag(FLAGS_target);
  if (absl::StripAsciiWhitespace(target).empty()) {
    return absl::InvalidArgumentError(
        "--target is empty: give the router's HOST:PORT (default "
        "localhost:50051; `pdserve up` prints it)");
  }
  return target;
}

}  // namespace pdserve
