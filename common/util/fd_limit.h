// The process's limit on open file descriptors (RLIMIT_NOFILE): every client
// connection, gRPC channel and UCX endpoint takes one, and a soft limit of
// 1024 (many distributions' default) is reached by a router with a thousand
// idle HTTP clients. Free functions over getrlimit/setrlimit; call
// RaiseOpenFileLimit once at process start, before threads.
#ifndef PDSERVE_COMMON_UTIL_FD_LIMIT_H_
#define PDSERVE_COMMON_UTIL_FD_LIMIT_H_

#include <cstdint>

namespace pdserve {

// Raises the soft limit to the hard limit (as Go's runtime and nginx do), so
// the operator's `ulimit -Hn` is what counts. Returns the soft limit in
// force afterwards (the old one if raising failed).
int64_t RaiseOpenFileLimit();

// The soft limit in force now (RLIM_INFINITY as INT64_MAX).
int64_t OpenFileLimit();

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_FD_LIMIT_H_
