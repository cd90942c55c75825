#include "common/util/system_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace pdserve {
namespace {

std::optional<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<int64_t> ReadNumber(
    const std::function<std::optional<std::string>(const std::string&)>& read,
    const std::string& path) {
  std::optional<std::string> text = read(path);
  if (!text.has_value()) return std::nullopt;
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &v)) {
    return std::nullopt;  // "max": no limit
  }
  return v;
}

// The page cache in a cgroup's memory.stat (reclaimable, as MemAvailable
// counts it): v1's total_ (hierarchical) keys where present.
int64_t FileCacheBytes(absl::string_view stat) {
  int64_t plain = 0, total = 0;
  bool has_total = false;
  for (absl::string_view line : absl::StrSplit(stat, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    int64_t v = 0;
    if (!absl::SimpleAtoi(kv.second, &v)) continue;
    if (kv.first == "active_file" || kv.first == "inactive_file") plain += v;
    if (kv.first == "total_active_file" || kv.first == "total_inactive_file") {
      total += v;
      has_total = true;
    }
  }
  return has_total ? total : plain;
}

// limit - (usage - page cache) from `dir`/`limit_file`, `dir`/`usage_file`
// and `dir`/memory.stat, trying the cgroup's own directory, then the mount's
// root (inside a container's cgroup namespace, the process's cgroup is the
// root).
std::optional<int64_t> Headroom(
    const std::function<std::optional<std::string>(const std::string&)>& read,
    const std::string& mount, const std::string& path,
    const std::string& limit_file, const std::string& usage_file) {
  for (const std::string& dir : {mount + path, mount}) {
    std::optional<int64_t> limit = ReadNumber(read, dir + "/" + limit_file);
    if (!limit.has_value()) continue;
    // cgroup v1 reports "no limit" as a huge page-aligned number.
    if (*limit >= (int64_t{1} << 60)) return std::nullopt;
    int64_t usage = ReadNumber(read, dir + "/" + usage_file).value_or(0);
    if (std::optional<std::string> stat = read(dir + "/memory.stat")) {
      usage = std::max<int64_t>(0, usage - FileCacheBytes(*stat));
    }
    return std::max<int64_t>(0, *limit - usage);
  }
  return std::nullopt;
}

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
}

}  // namespace

std::optional<int64_t> CgroupHeadroom(
    absl::string_view proc_self_cgroup,
    const std::function<std::optional<std::string>(const std::string&)>& read) {
  // Lines "ID:CONTROLLERS:PATH": "0::PATH" is cgroup v2, a line naming the
  // memory controller is v1.
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    std::string path(f[2]);
    if (path == "/") path.clear();
    bool memory_v1 = false;
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      memory_v1 = memory_v1 || c == "memory";
    }
    if (memory_v1) {
      return Headroom(read, "/sys/fs/cgroup/memory", path,
                      "memory.limit_in_bytes", "memory.usage_in_bytes");
    }
  }
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    if (!absl::StartsWith(line, "0::")) continue;
    std::string path(line.substr(3));
    if (path == "/") path.clear();
    return Headroom(read, "/sys/fs/cgroup", path, "memory.max",
                    "memory.current");
  }
  return std::nullopt;
}

std::string AvailableMemory::Describe() const {
  std::string s =
      absl::StrCat(GiB(bytes), " (MemAvailable ", GiB(mem_available));
  if (cgroup_headroom.has_value()) {
    absl::StrAppend(&s, ", cgroup memory limit less its usage ",
                    GiB(*cgroup_headroom));
  }
  return s + ")";
}

absl::StatusOr<AvailableMemory> AvailableMemoryNow() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  int64_t available_kib = -1;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream ls(line.substr(13));
      ls >> available_kib;
    }
  }
  if (available_kib < 0) {
    return absl::UnavailableError(
        "cannot read MemAvailable from /proc/meminfo");
  }
  AvailableMemory m;
  m.mem_available = available_kib * 1024;
  m.bytes = m.mem_available;
  if (std::optional<std::string> cg = ReadWhole("/proc/self/cgroup")) {
    m.cgroup_headroom = CgroupHeadroom(*cg, ReadWhole);
    if (m.cgroup_headroom.has_value()) {
      m.bytes = std::min(m.bytes, *m.cgroup_headroom);
    }
  }
  return m;
}

}  // namespace pdserve
