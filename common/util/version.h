// pdserve's version, one constant for everything that reports it: the
// `version` subcommand and the router's `GET /version` (vLLM's endpoint).
#ifndef PDSERVE_COMMON_UTIL_VERSION_H_
#define PDSERVE_COMMON_UTIL_VERSION_H_

namespace pdserve {

inline constexpr char kPdserveVersion[] = "0.1.0";

}  // namespace pdserve

#endif  // PDSERVE_COMMON_UTIL_VERSION_H_
