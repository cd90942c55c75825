// Copies whose destination bypasses the cache: non-temporal stores write
// whole cache lines to memory without reading them in first, a third less
// memory traffic than memcpy's ordinary stores for a destination nobody
// reads soon (a long prompt's KV landing in D's pool). Thread-safe.
#ifndef PDSERVE_COMMON_UTIL_STREAMING_COPY_H_
#define PDSERVE_COMMON_UTIL_STREAMING_COPY_H_

#include <cstddef>

namespace pdserve {

// How a copy writes its destination: ordinary stores (kCached: it stays in
// cache for whoever reads it next, e.g. a send buffer the peer reads right
// away) or non-temporal ones (kStreaming).
enum class Stores { kCached, kStreaming };

// memcpy(dst, src, size) with non-temporal stores where the CPU has AVX2
// (the unaligned head and tail use ordinary stores), fenced before it
// returns so that whatever publishes dst afterwards orders after it.
// Plain memcpy elsewhere.
void StreamingCopy(void* dst, const void* src, size_t size);

// The same without the fence, for a run of copies (or other non-temporal
// stores) that ends with one StreamingFence.
void StreamingCopyUnfenced(void* dst, const void* src, size_t size);
void StreamingFence();

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_STREAMING_COPY_H_
