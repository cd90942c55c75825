#include "router/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace pdserve {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops,
                                     bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {}

std::string StopStringMatcher::Add(const std::string& delta, bool may_stop) {
  if (stopped_) return "";
  pending_ += delta;
  if (stops_.empty()) return std::exchange(pending_, "");
  if (!may_stop) return Release();
  // Earliest complete stop string.
  size_t cut = std::string::npos;
  size_t stop_len = 0;
  for (const std::string& s : stops_) {
    size_t pos = pending_.find(s);
    if (pos != std::string::npos && (cut == std::string::npos || pos < cut)) {
      cut = pos;
      stop_len = s.size();
    }
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, include_stop_ ? cut + stop_len : cut);
    pending_.clear();
    return out;
  }
  return Release();
}

std::string StopStringMatcher::Release() {
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::Flush() {
  if (stopped_) return "";
  return std::exchange(pending_, "");
}

}  // namespace pdserve
