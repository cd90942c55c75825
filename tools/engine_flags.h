// EngineOptions from the engine flags of tools/common_flags.h (--model,
// --dtype, --quantization, --kv_dtype, --kv_cache_memory, --block_size,
// --threads, --device,
// --prefix_caching). One definition for the engine subcommands (complete)
// and the services (prefill, decode); builds without gRPC. Stateless:
// thread-safe.
#ifndef PDSERVE_TOOLS_ENGINE_FLAGS_H_
#define PDSERVE_TOOLS_ENGINE_FLAGS_H_

#include "absl/status/statusor.h"
#include "common/engine/engine.h"

namespace pdserve {

// INVALID_ARGUMENT for an unknown dtype or a bad --kv_cache_memory.
absl::StatusOr<EngineOptions> EngineOptionsFromFlags();

// --kv_cache_memory in bytes (a fraction resolved against the memory
// available now); the error names the flag (ParseMemorySize).
absl::StatusOr<int64_t> KvCacheBytesFromFlags();

}  // namespace pdserve

#endif  // PDSERVE_TOOLS_ENGINE_FLAGS_H_
