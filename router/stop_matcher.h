// StopStringMatcher: applies stop strings to a stream of text deltas. Text
// that could still be the start of a stop string is held back; when a stop
// string completes, the text before it is released (and the stop string
// itself with include_stop) and the rest dropped. One per request; not
// thread-safe.
#ifndef PDSERVE_ROUTER_STOP_MATCHER_H_
#define PDSERVE_ROUTER_STOP_MATCHER_H_

#include <string>
#include <vector>

namespace pdserve {

class StopStringMatcher {
 public:
  // The earliest stop string in the text ends it; of several starting at the
  // same place, the first listed.
  explicit StopStringMatcher(std::vector<std::string> stops,
                             bool include_stop = false);
  // Adds a delta; returns the text that is now safe to emit. With
  // may_stop false (the output is still short of min_tokens) no stop string
  // ends the text: one complete in it is emitted as text, and only a
  // possible start of one is held back.
  std::string Add(const std::string& delta, bool may_stop = true);
  // Releases what is held back (call when the stream ends without a stop).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  // Emits pending_ but for its longest suffix that is a proper prefix of a
  // stop string.
  std::string Release();

  std::vector<std::string> stops_;
  bool include_stop_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_STOP_MATCHER_H_
