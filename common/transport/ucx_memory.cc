// UcxWorker's memory registration (the rest of the worker is in
// ucx_worker.cc): regions registered once and unregistered with the object.
#include <sys/mman.h>
#include <sys/shm.h>
#include <ucp/api/ucp.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transport/ucx_worker.h"
#include "common/transport/ucx_worker_internal.h"
#include "common/util/huge_pages.h"

namespace pdserve::transport {
absl::string_view UcxMemoryTypeName(UcxMemoryType type) {
  return type == UcxMemoryType::kCuda ? "cuda" : "host";
}

absl::StatusOr<UcxMemoryType> ParseUcxMemoryType(absl::string_view name) {
  if (name == "host" || name.empty()) return UcxMemoryType::kHost;
  if (name == "cuda") return UcxMemoryType::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown UCX memory type '", name, "'"));
}

UcxRegion::~UcxRegion() { worker_->Unregister(*this); }

namespace {

// The shmid of one md's part of a packed key when it is a System V key:
// {u32 shmid, u64 owner address} packed (12 bytes), the owner address (where
// the segment sits in the peer) page-aligned and not 0, so that another
// transport's 12-byte key is left to UCX rather than taken for a segment that
// is gone.
std::optional<int> SysvShmid(const uint8_t* part, size_t size) {
  if (size != 12) return std::nullopt;
  uint32_t shmid;
  uint64_t owner_address;
  std::memcpy(&shmid, part, 4);
  std::memcpy(&owner_address, part + 4, 8);
  if (owner_address == 0 || owner_address % 4096 != 0) return std::nullopt;
  return static_cast<int>(shmid);
}

// The System V segments a packed remote key names, attached (read-only)
// here so that they outlive their owner for as long as UCX unpacks the key;
// UNAVAILABLE when one is gone already: its owner exited (kill -9 of a
// prefill worker between its push header and this mapping). UCX 1.13 must
// not see such a key: when one transport's key fails to unpack it releases
// the ones after it uninitialised (SIGSEGV at 0x38, seen in ChaosSoak).
// UCX 1.13's packed key: u64 md map, u8 memory type, then per md a u8 size
// and that many bytes (SysvShmid tells a sysv part). A key that does not
// parse is left to UCX.
class SysvSegmentPins {
 public:
  absl::Status Pin(const std::string& packed_rkey) {
    const auto* p = reinterpret_cast<const uint8_t*>(packed_rkey.data());
    const uint8_t* end = p + packed_rkey.size();
    if (end - p < 9) return absl::OkStatus();
    uint64_t md_map;
    std::memcpy(&md_map, p, 8);
    p += 9;
    for (; md_map != 0; md_map &= md_map - 1) {
      if (p >= end) break;
      const size_t size = *p++;
      if (static_cast<size_t>(end - p) < size) break;
      if (const std::optional<int> shmid = SysvShmid(p, size)) {
        void* at = shmat(*shmid, nullptr, SHM_RDONLY);
        if (at != reinterpret_cast<void*>(-1)) {
          attached_.push_back(at);
        } else if (errno == EINVAL || errno == EIDRM) {
          return absl::UnavailableError(
              absl::StrCat("the peer's shared memory (System V segment ",
                           *shmid, ") is gone: the peer exited"));
        }
      }
      p += size;
    }
    return absl::OkStatus();
  }
  ~SysvSegmentPins() {
    for (void* at : attached_) shmdt(at);
  }

 private:
  std::vector<void*> attached_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxWorker::Allocate(int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("empty UCX region");
  const int64_t size =
      (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  // On 2 MiB boundaries, advised for huge pages: fewer, larger pages for
  // the kernel to pin or walk per transfer.
  void* p = MapForStreaming(size);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", size, " bytes: ", strerror(errno)));
  }
  std::unique_ptr<UcxRegion> region(new UcxRegion(
      this, static_cast<char*>(p), size, UcxMemoryType::kHost, true));
  absl::Status s = MapRegion(*region);
  if (!s.ok()) return s;  // the region's destructor unmaps it
  return region;
}

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxWorker::AllocateShared(
    int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("empty UCX region");
  auto context = static_cast<ucp_context_h>(context_);
  ucp_mem_map_params_t mp{};
  mp.field_mask =
      UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.length = static_cast<size_t>(bytes);
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context, &mp, &memh);
  if (st != UCS_OK) return UcxError("allocating UCX shared memory", st);
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(memh, &attr);
  void* packed = nullptr;
  size_t packed_size = 0;
  if (st == UCS_OK) st = ucp_rkey_pack(context, memh, &packed, &packed_size);
  if (st != UCS_OK) {
    ucp_mem_unmap(context, memh);
    return UcxError("describing UCX shared memory", st);
  }
  // UCX owns the memory (ucp_mem_unmap frees it): not `owned`.
  std::unique_ptr<UcxRegion> region(new UcxRegion(
      this, static_cast<char*>(attr.address), static_cast<int64_t>(attr.length),
      UcxMemoryType::kHost, false));
  region->memh_ = memh;
  region->packed_rkey_.assign(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  counters_.registrations.fetch_add(1);
  counters_.registered_bytes.fetch_add(region->size_);
  return region;
}

absl::StatusOr<std::unique_ptr<UcxRemoteMemory>> UcxWorker::MapRemote(
    const std::string& peer_address, const std::string& packed_rkey) {
  if (packed_rkey.empty()) {
    return absl::InvalidArgumentError("empty UCX remote key");
  }
  auto connection = Connect(peer_address, /*peer_errors=*/false);
  if (!connection.ok()) return connection.status();
  SysvSegmentPins pins;
  if (absl::Status s = pins.Pin(packed_rkey); !s.ok()) {
    (*connection)->CloseWhenUnused();
    return s;
  }
  ucp_rkey_h rkey = nullptr;
  {
    UcxEndpointState& ep = *(*connection)->ep_;
    absl::MutexLock lock(&ep.mu);
    if (ep.ep == nullptr) {
      return absl::UnavailableError("UCX endpoint to the peer is closed");
    }
    ucs_status_t st = ucp_ep_rkey_unpack(ep.ep, packed_rkey.data(), &rkey);
    if (st != UCS_OK) return UcxError("unpacking a UCX remote key", st);
  }
  return std::unique_ptr<UcxRemoteMemory>(
      new UcxRemoteMemory(*std::move(connection), rkey));
}

UcxRemoteMemory::~UcxRemoteMemory() {
  ucp_rkey_destroy(static_cast<ucp_rkey_h>(rkey_));
  connection_.reset();
}

void* UcxRemoteMemory::Pointer(uint64_t address) const {
  void* local = nullptr;
  if (ucp_rkey_ptr(static_cast<ucp_rkey_h>(rkey_), address, &local) != UCS_OK) {
    return nullptr;
  }
  return local;
}

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxWorker::Register(
    void* data, int64_t bytes, UcxMemoryType type) {
  if (bytes <= 0) return absl::InvalidArgumentError("empty UCX region");
  std::unique_ptr<UcxRegion> region(
      new UcxRegion(this, static_cast<char*>(data), bytes, type, false));
  absl::Status s = MapRegion(*region);
  if (!s.ok()) return s;
  return region;
}

absl::Status UcxWorker::MapRegion(UcxRegion& region) {
  // The context is shared by threads (mt_workers_shared): registration runs
  // in the caller's thread.
  auto context = static_cast<ucp_context_h>(context_);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                  UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  mp.address = region.data_;
  mp.length = static_cast<size_t>(region.size_);
  mp.memory_type = region.type_ == UcxMemoryType::kCuda ? UCS_MEMORY_TYPE_CUDA
                                                        : UCS_MEMORY_TYPE_HOST;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context, &mp, &memh);
  if (st != UCS_OK) {
    return UcxError(absl::StrCat("registering ",
                                 UcxMemoryTypeName(region.type_), " memory"),
                    st);
  }
  region.memh_ = memh;
  counters_.registrations.fetch_add(1);
  counters_.registered_bytes.fetch_add(region.size_);
  return absl::OkStatus();
}

void UcxWorker::Unregister(UcxRegion& region) {
  if (region.memh_ != nullptr) {
    ucp_mem_unmap(static_cast<ucp_context_h>(context_),
                  static_cast<ucp_mem_h>(region.memh_));
    counters_.registrations.fetch_sub(1);
    counters_.registered_bytes.fetch_sub(region.size_);
  }
  if (region.owned_) munmap(region.data_, static_cast<size_t>(region.size_));
}

}  // namespace pdserve::transport
