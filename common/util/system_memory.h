// How much memory this process may still take: the kernel's estimate of
// available memory (/proc/meminfo MemAvailable), capped by the memory limit
// of the process's cgroup less what the cgroup already uses besides its
// reclaimable page cache (a container's limit, which MemAvailable does not
// show). Sizing a KV pool from the
// node's figure alone gets a worker in a container OOM-killed.
// Free functions reading /proc and /sys; thread-safe.
#ifndef PDSERVE_COMMON_UTIL_SYSTEM_MEMORY_H_
#define PDSERVE_COMMON_UTIL_SYSTEM_MEMORY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve {

struct AvailableMemory {
  int64_t bytes = 0;          // what may still be taken
  int64_t mem_available = 0;  // MemAvailable
  // The cgroup's limit less its usage, where a limit is set.
  std::optional<int64_t> cgroup_headroom;
  std::string Describe() const;  // "23.1 GiB (MemAvailable 23.1 GiB, ...)"
};

// UNAVAILABLE when /proc/meminfo cannot be read.
absl::StatusOr<AvailableMemory> AvailableMemoryNow();

// The cgroup headroom from the files of one cgroup: `proc_self_cgroup` is
// /proc/self/cgroup's text, `read` returns a file's contents under
// /sys/fs/cgroup (nullopt when absent). Exposed for tests.
std::optional<int64_t> CgroupHeadroom(
    absl::string_view proc_self_cgroup,
    const std::function<std::optional<std::string>(const std::string&)>& read);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_SYSTEM_MEMORY_H_
