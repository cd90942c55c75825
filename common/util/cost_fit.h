// CostFit: an exponentially weighted least-squares fit of a duration against
// a size, seconds = overhead + size / rate, over recent samples (e.g. prefill
// seconds against prompt tokens). Workers report the fit for the router's
// --mode=auto policy (router/disaggregation_policy.h). Also Ewma, an
// exponentially weighted moving average. Both thread-safe.
#ifndef PDSERVE_COMMON_UTIL_COST_FIT_H_
#define PDSERVE_COMMON_UTIL_COST_FIT_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pdserve {

class CostFit {
 public:
  struct Estimate {
    double rate = 0;      // size units per second (0: not measured yet)
    double overhead = 0;  // seconds, >= 0
  };

  // `alpha`: weight of a new sample (0 < alpha <= 1).
  explicit CostFit(double alpha = 0.2) : alpha_(alpha) {}

  // Ignores samples with size <= 0 or seconds <= 0.
  void Add(double size, double seconds);
  // Sizes all (nearly) equal: overhead 0 and rate = mean size / mean seconds;
  // otherwise the weighted least-squares line (slope clamped positive, the
  // overhead clamped to [0, mean seconds]).
  Estimate Get() const;

 private:
  const double alpha_;
  mutable absl::Mutex mu_;
  bool empty_ ABSL_GUARDED_BY(mu_) = true;
  // Exponentially weighted means of x, y, x^2 and x*y.
  double mx_ ABSL_GUARDED_BY(mu_) = 0;
  double my_ ABSL_GUARDED_BY(mu_) = 0;
  double mxx_ ABSL_GUARDED_BY(mu_) = 0;
  double mxy_ ABSL_GUARDED_BY(mu_) = 0;
};

class Ewma {
 public:
  explicit Ewma(double alpha = 0.2) : alpha_(alpha) {}
  void Add(double value);  // the first sample sets the average
  double Get() const;      // 0 until the first sample

 private:
  const double alpha_;
  mutable absl::Mutex mu_;
  bool empty_ ABSL_GUARDED_BY(mu_) = true;
  double value_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_COST_FIT_H_
