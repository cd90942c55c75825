// How often a handler blocked in a synchronous gRPC method looks at
// ServerContext::IsCancelled (the sync API has no cancellation callback).
// Every 20 ms for the first 200 ms of a wait, then every 100 ms: a quick
// wait notices a cancel as fast as before, and the hundreds of handlers that
// queue under overload wake 5x less often (docs/scheduling.md, "Handlers
// queued under that overload"). One per handler; not thread-safe.
#ifndef PDSERVE_COMMON_GRPC_UTIL_CANCELLATION_POLL_H_
#define PDSERVE_COMMON_GRPC_UTIL_CANCELLATION_POLL_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pdserve {

class CancellationPoll {
 public:
  static constexpr absl::Duration kFastInterval = absl::Milliseconds(20);
  static constexpr absl::Duration kSlowInterval = absl::Milliseconds(100);
  static constexpr absl::Duration kFastPhase = absl::Milliseconds(200);

  // How long to wait before the next look.
  absl::Duration Interval() const {
    return absl::Now() - since_ < kFastPhase ? kFastInterval : kSlowInterval;
  }
  // Progress was made (a token arrived): the wait starts anew.
  void Reset() { since_ = absl::Now(); }

 private:
  absl::Time since_ = absl::Now();
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_GRPC_UTIL_CANCELLATION_POLL_H_
