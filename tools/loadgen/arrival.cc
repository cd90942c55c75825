#include "tools/loadgen/arrival.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pdserve::loadgen {

absl::StatusOr<double> ParseRequestRate(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "inf" || t == "infinity") {
    return std::numeric_limits<double>::infinity();
  }
  double rate = 0.0;
  if (!absl::SimpleAtod(t, &rate) || !(rate > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad request rate '", text, "' (a positive number or inf)"));
  }
  return rate;
}

std::vector<double> ArrivalOffsets(int32_t n, double rate, double burstiness,
                                   uint64_t seed) {
  std::vector<double> offsets(n > 0 ? n : 0, 0.0);
  if (n <= 0 || std::isinf(rate)) return offsets;
  std::mt19937_64 rng(seed);
  // Gamma(shape k, scale theta) has mean k*theta = 1/rate.
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double t = 0.0;
  for (int32_t i = 1; i < n; ++i) {
    t += gap(rng);
    offsets[i] = t;
  }
  return offsets;
}

}  // namespace pdserve::loadgen
