// POSIX shared-memory segments for the same-host KV transport: ShmSegment
// creates (random unguessable name with the creator's pid, mode 0600, pages
// reserved with posix_fallocate so a full /dev/shm fails here and not with
// SIGBUS later) or opens read-only one mapped segment; ShmProbe is the small
// segment holding a random nonce through which a decode worker proves that a
// prefill worker shares its /dev/shm. Thread-compatible, except Unlink(),
// which any thread may call.
#ifndef PDSERVE_COMMON_TRANSPORT_SHM_SEGMENT_H_
#define PDSERVE_COMMON_TRANSPORT_SHM_SEGMENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pdserve::transport {

// Name prefixes (shm_open names; the files are /dev/shm/<name without '/'>).
inline constexpr char kShmKvPrefix[] = "/pdserve-kv-";
inline constexpr char kShmProbePrefix[] = "/pdserve-probe-";

// `prefix` + "<pid>-" + 32 random hex digits (getrandom).
absl::StatusOr<std::string> RandomShmName(absl::string_view prefix);

class ShmSegment {
 public:
  // Creates, sizes and maps (read-write) a new segment named
  // RandomShmName(prefix). The segment is unlinked when this object dies.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(
      absl::string_view prefix, int64_t size);
  // Maps an existing segment read-only; fails unless its size is `size`.
  // Unlinks nothing unless Unlink() is called.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> OpenReadOnly(
      const std::string& name, int64_t size);
  ~ShmSegment();  // unmaps; unlinks a created segment
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Removes the name (the mapping stays valid). Idempotent, thread-safe.
  void Unlink();
  bool unlinked() const { return unlinked_.load(); }
  const std::string& name() const { return name_; }
  int64_t size() const { return size_; }
  const char* data() const { return data_; }
  char* mutable_data() { return writable_ ? data_ : nullptr; }

 private:
  ShmSegment(std::string name, char* data, int64_t size, bool writable);
  const std::string name_;
  char* const data_;
  const int64_t size_;
  const bool writable_;
  std::atomic<bool> unlinked_;
};

// A decode worker's probe: a segment holding a random 16-byte nonce.
class ShmProbe {
 public:
  static absl::StatusOr<std::unique_ptr<ShmProbe>> Create();
  const std::string& name() const { return segment_->name(); }
  const std::string& nonce() const { return nonce_; }

 private:
  ShmProbe(std::unique_ptr<ShmSegment> segment, std::string nonce)
      : segment_(std::move(segment)), nonce_(std::move(nonce)) {}
  std::unique_ptr<ShmSegment> segment_;
  std::string nonce_;
};

// True when this process can open probe `name` and it holds `nonce`.
bool ShmProbeMatches(const std::string& name, absl::string_view nonce);

// Unlinks pdserve segments (KV and probes) in /dev/shm whose creator process
// (the pid in the name) no longer exists and that are older than `min_age`:
// what a kill -9 left behind. A segment of a live process in another pid
// namespace sharing /dev/shm may be removed too: the push it belonged to then
// falls back to gRPC (D had not opened it) or was already mapped. Returns how
// many were removed. Thread-safe.
int SweepStaleShmSegments(absl::Duration min_age);

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_SHM_SEGMENT_H_
