// The ack word that follows a KV chunk a prefill worker (P) leaves in place
// for a decode worker (D) on the same host: both processes map it, and it
// says who may touch the chunk's buffer. Internal to the UCX transport.
#ifndef PDSERVE_COMMON_TRANSPORT_UCX_IN_PLACE_ACK_H_
#define PDSERVE_COMMON_TRANSPORT_UCX_IN_PLACE_ACK_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <ctime>

#include "absl/time/time.h"

namespace pdserve::transport::in_place_ack {

// The states of the word for a chunk with UCX tag `tag` (tags lie in
// [2^24, 2^62): the top two bits carry the state, so no state of one tag
// equals any state of another, and a late reader of a reused buffer cannot
// take the new chunk's word for its own):
//   Announced(tag)  P wrote the chunk and announced it; nobody reads it.
//   Claimed(tag)    D is reading it (Claim).
//   tag             D is done with it (Release): P may reuse the buffer.
//   Revoked(tag)    P abandoned its push before D claimed the chunk
//                   (Revoke): D must not read it, P may reuse the buffer.
// Claim and Revoke are one compare-and-swap each from Announced(tag), so
// exactly one of them wins: P never rewrites a buffer D is reading, however
// late D's read comes after P gave up (a stalled decode worker).
// Lock-free; the word is shared between processes.
inline constexpr uint64_t kAnnouncedBit = uint64_t{1} << 62;
inline constexpr uint64_t kClaimedBit = uint64_t{1} << 63;

// Whether `tag` can mark a chunk in place.
inline bool ValidTag(uint64_t tag) {
  return tag >= (uint64_t{1} << 24) && tag < kAnnouncedBit;
}
inline uint64_t Announced(uint64_t tag) { return tag | kAnnouncedBit; }
inline uint64_t Claimed(uint64_t tag) { return tag | kClaimedBit; }
inline uint64_t Revoked(uint64_t tag) {
  return tag | kAnnouncedBit | kClaimedBit;
}

// P, before announcing the chunk.
inline void Announce(uint64_t* word, uint64_t tag) {
  __atomic_store_n(word, Announced(tag), __ATOMIC_RELEASE);
}

// D, before reading the chunk: true when it is D's to read; false when P
// revoked it (or the word is another chunk's: the buffer was reused).
inline bool Claim(uint64_t* word, uint64_t tag) {
  uint64_t expected = Announced(tag);
  return __atomic_compare_exchange_n(word, &expected, Claimed(tag), false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

// Waiting for a state change without spinning: a process-shared futex on
// the word's upper half, where the state bits are (every transition changes
// it), so a P with many pushes waiting on a slow D costs no CPU.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the futex is on the upper half of the ack word");
inline uint32_t* UpperHalf(const uint64_t* word) {
  return reinterpret_cast<uint32_t*>(const_cast<uint64_t*>(word)) + 1;
}

// P: sleeps until the word may no longer hold `seen` (D woke it), at most
// `timeout`; returns at once when it already changed. May return early.
inline void AwaitChange(const uint64_t* word, uint64_t seen,
                        absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return;
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, UpperHalf(word), FUTEX_WAIT,
          static_cast<uint32_t>(seen >> 32), &ts, nullptr, 0);
}

// D, once it no longer reads the chunk it claimed; wakes a P waiting for it.
inline void Release(uint64_t* word, uint64_t tag) {
  __atomic_store_n(word, tag, __ATOMIC_RELEASE);
  syscall(SYS_futex, UpperHalf(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// P: D is done with the chunk.
inline bool Released(const uint64_t* word, uint64_t tag) {
  return __atomic_load_n(word, __ATOMIC_ACQUIRE) == tag;
}

// P, abandoning its push: revokes the chunk unless D claimed it. True when
// D will never read the buffer again (revoked now or before, or released);
// false when D is reading it (or the word is not this chunk's): the buffer
// is then reused only once Released.
inline bool Revoke(uint64_t* word, uint64_t tag) {
  uint64_t seen = Announced(tag);
  if (__atomic_compare_exchange_n(word, &seen, Revoked(tag), false,
                                  __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    return true;
  }
  return seen == tag || seen == Revoked(tag);
}

}  // namespace pdserve::transport::in_place_ack

#endif  // PDSERVE_COMMON_TRANSPORT_UCX_IN_PLACE_ACK_H_
