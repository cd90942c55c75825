// The servers of http_libs_bench (DESIGN.md, docs/openai.md "Why Boost.Beast"):
// each candidate HTTP library from Debian 12 serving one server-sent-events
// workload (K events of ~100 bytes, one every `interval`, like tokens). Serve
// runs in a forked child and never returns; nothing here is shared between
// threads of the bench's own process.
#ifndef PDSERVE_TOOLS_BENCH_HTTP_BENCH_SERVERS_H_
#define PDSERVE_TOOLS_BENCH_HTTP_BENCH_SERVERS_H_

#include <chrono>
#include <string>

namespace pdserve::http_bench {

using Clock = std::chrono::steady_clock;

struct Workload {
  int events = 100;
  std::chrono::milliseconds interval{20};
  int threads = 2;  // Beast's io_context threads, MHD's epoll thread pool
};

// Serves `lib` (beast | mhd | httplib | httplib_backlog | httplib_tuned, the
// last with `n` pool threads) on a free loopback port, which it writes to
// `port_fd` (or prints, when port_fd < 0), until killed; exits 2 for an
// unknown library.
[[noreturn]] void Serve(const std::string& lib, int port_fd, const Workload& w,
                        int n);

}  // namespace pdserve::http_bench

#endif  // PDSERVE_TOOLS_BENCH_HTTP_BENCH_SERVERS_H_
