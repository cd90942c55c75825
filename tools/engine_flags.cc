#include "tools/engine_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/model/dtype.h"
#include "common/util/status_macros.h"
#include "tools/common_flags.h"

namespace pdserve {

absl::StatusOr<int64_t> KvCacheBytesFromFlags() {
  auto bytes = ParseMemorySize(absl::GetFlag(FLAGS_kv_cache_memory));
  if (!bytes.ok()) {
    return absl::Status(
        bytes.status().code(),
        absl::StrCat("--kv_cache_memory: ", bytes.status().message()));
  }
  return *bytes;
}

absl::StatusOr<EngineOptions> EngineOptionsFromFlags() {
  EngineOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  ASSIGN_OR_RETURN(o.weight_dtype,
                   ParseComputeDType(absl::GetFlag(FLAGS_dtype)));
  ASSIGN_OR_RETURN(o.quantization,
                   ParseQuantization(absl::GetFlag(FLAGS_quantization)));
  const std::string kv = absl::GetFlag(FLAGS_kv_dtype);
  if (kv != "auto") {
    ASSIGN_OR_RETURN(DType kv_dtype, ParseComputeDType(kv));
    o.kv_dtype = kv_dtype;
  }
  ASSIGN_OR_RETURN(o.kv_cache_bytes, KvCacheBytesFromFlags());
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.num_threads = absl::GetFlag(FLAGS_threads);
  o.device = absl::GetFlag(FLAGS_device);  // Engine::Create validates it
  o.enable_prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  return o;
}

}  // namespace pdserve
