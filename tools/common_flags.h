// Flags shared by several subcommands. Abseil flags are global to the binary,
// so a flag used by more than one subcommand is declared here exactly once.
// Subcommand-specific flags live in that subcommand's file.
#ifndef PDSERVE_TOOLS_COMMON_FLAGS_H_
#define PDSERVE_TOOLS_COMMON_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"

// Engine.
ABSL_DECLARE_FLAG(std::string, model);         // HF directory or synthetic:NAME
ABSL_DECLARE_FLAG(std::string, dtype);         // f32 | bf16 (weights)
ABSL_DECLARE_FLAG(std::string, quantization);  // none | int8 | int4[-g128]...
ABSL_DECLARE_FLAG(std::string, kv_dtype);      // auto (= dtype) | f32 | bf16
ABSL_DECLARE_FLAG(std::string,
                  kv_cache_memory);  // bytes ("512MiB") or fraction ("0.2")
ABSL_DECLARE_FLAG(int32_t, block_size);
ABSL_DECLARE_FLAG(int32_t, threads);  // 0 = all cores
ABSL_DECLARE_FLAG(int32_t, max_num_seqs);
ABSL_DECLARE_FLAG(int32_t, prefill_chunk_tokens);  // 0 = no chunk limit
ABSL_DECLARE_FLAG(std::string, device);            // cpu | cuda
ABSL_DECLARE_FLAG(bool, prefix_caching);        // reuse cached prefix KV blocks
ABSL_DECLARE_FLAG(std::string, tokenizer);      // "" = the --model directory's
ABSL_DECLARE_FLAG(std::string, chat_template);  // "" = the model's template

// Request: sampling and stopping (complete, generate, bench).
ABSL_DECLARE_FLAG(int32_t, max_tokens);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(double, min_p);
ABSL_DECLARE_FLAG(double, repetition_penalty);
ABSL_DECLARE_FLAG(double, presence_penalty);
ABSL_DECLARE_FLAG(double, frequency_penalty);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(int32_t, top_logprobs);
ABSL_DECLARE_FLAG(int32_t, prompt_logprobs);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop);            // stop strings
ABSL_DECLARE_FLAG(std::vector<std::string>, stop_token_ids);  // extra stop ids
ABSL_DECLARE_FLAG(std::vector<std::string>, prompt_ids);      // 1,2,3

// Clients of the router (generate, bench).
ABSL_DECLARE_FLAG(std::string, target);  // router HOST:PORT

// Input/output.
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::string, input_jsonl);

namespace pdserve {

// Flag groups for a subcommand's shared flags (PDSERVE_SUBCOMMAND in
// tools/subcommand.h), named after what reads them.
// The engine: what EngineOptionsFromFlags (tools/engine_flags.h) reads.
std::vector<std::string> EngineFlagNames();
// Sampling and stopping of a request (complete, generate, up's demo).
std::vector<std::string> SamplingFlagNames();

// --target, refused when empty (gRPC would only say "Failed to create
// secure client channel").
absl::StatusOr<std::string> RouterTargetFromFlags();

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_COMMON_FLAGS_H_
