#include "common/util/cost_fit.h"

#include <algorithm>
#include <cmath>

namespace pdserve {

void CostFit::Add(double size, double seconds) {
  if (!(size > 0) || !(seconds > 0)) return;
  absl::MutexLock lock(&mu_);
  const double a = empty_ ? 1.0 : alpha_;
  empty_ = false;
  mx_ += a * (size - mx_);
  my_ += a * (seconds - my_);
  mxx_ += a * (size * size - mxx_);
  mxy_ += a * (size * seconds - mxy_);
}

CostFit::Estimate CostFit::Get() const {
  absl::MutexLock lock(&mu_);
  Estimate e;
  if (empty_ || !(mx_ > 0) || !(my_ > 0)) return e;
  const double var = mxx_ - mx_ * mx_;
  const double cov = mxy_ - mx_ * my_;
  // Sizes spread by less than ~5% of their mean: no usable slope.
  if (var <= 0.0025 * mx_ * mx_ || cov <= 0) {
    e.rate = mx_ / my_;
    return e;
  }
  const double slope = cov / var;  // seconds per unit
  e.overhead = std::clamp(my_ - slope * mx_, 0.0, my_);
  // Keep the line through the mean once the overhead is clamped.
  const double per_unit = (my_ - e.overhead) / mx_;
  e.rate = per_unit > 0 ? 1.0 / per_unit : mx_ / my_;
  return e;
}

void Ewma::Add(double value) {
  absl::MutexLock lock(&mu_);
  value_ = empty_ ? value : value_ + alpha_ * (value - value_);
  empty_ = false;
}

double Ewma::Get() const {
  absl::MutexLock lock(&mu_);
  return value_;
}

}  // namespace pdserve
