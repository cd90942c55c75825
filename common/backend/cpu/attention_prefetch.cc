#include "common/backend/cpu/attention_prefetch.h"

#include <cstdlib>
#include <cstring>

namespace pdserve::cpu_internal {
namespace {

bool DetectPrefetchToL2() {
  const char* env = std::getenv("PDSERVE_ATTENTION_PREFETCH");
  if (env != nullptr && std::strcmp(env, "l1") == 0) return false;
  if (env != nullptr && std::strcmp(env, "l2") == 0) return true;
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
}

}  // namespace

bool AttentionPrefetchToL2() {
  static const bool to_l2 = DetectPrefetchToL2();
  return to_l2;
}

}  // namespace pdserve::cpu_internal
