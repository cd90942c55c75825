// Status helpers: Debian 12's Abseil (20220623) has no status macros, so the
// project carries these two. Usable in any function returning absl::Status or
// absl::StatusOr<T>.
#ifndef PDSERVE_COMMON_UTIL_STATUS_MACROS_H_
#define PDSERVE_COMMON_UTIL_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PDSERVE_STATUS_CONCAT_INNER_(a, b) a##b
#define PDSERVE_STATUS_CONCAT_(a, b) PDSERVE_STATUS_CONCAT_INNER_(a, b)

// RETURN_IF_ERROR(expr): evaluates expr (a Status) and returns it if not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status pdserve_status_ = (expr);           \
    if (!pdserve_status_.ok()) return pdserve_status_; \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates expr (a StatusOr<T>); on error
// returns its status, otherwise moves the value into lhs (which may declare a
// variable: ASSIGN_OR_RETURN(auto x, Foo());).
#define ASSIGN_OR_RETURN(lhs, expr)                                           \
  ASSIGN_OR_RETURN_IMPL_(PDSERVE_STATUS_CONCAT_(pdserve_statusor_, __LINE__), \
                         lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

#endif  // PDSERVE_COMMON_UTIL_STATUS_MACROS_H_
