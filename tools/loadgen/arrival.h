// Request arrival process of `pdserve bench`: planned send times of each
// request, as offsets in seconds from the start of the run. Pure functions.
#ifndef PDSERVE_TOOLS_LOADGEN_ARRIVAL_H_
#define PDSERVE_TOOLS_LOADGEN_ARRIVAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::loadgen {

// Parses a request rate in requests/s: a positive number or "inf".
absl::StatusOr<double> ParseRequestRate(const std::string& text);

// Arrival offsets for n requests at `rate` requests/s (infinity: all at 0).
// Inter-arrival gaps are gamma distributed with shape `burstiness` and mean
// 1/rate: burstiness 1 is a Poisson process, < 1 burstier, > 1 more regular.
// The first request arrives at 0. Deterministic for a given seed.
std::vector<double> ArrivalOffsets(int32_t n, double rate, double burstiness,
                                   uint64_t seed);

}  // namespace pdserve::loadgen

#endif  // PDSERVE_TOOLS_LOADGEN_ARRIVAL_H_
