// UcxWorker's memory registration (the rest of the worker is in
// ucx_worker.cc): regions registered once and unregistered with the object.
#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/transport/ucx_worker.h"
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
