// http_libs_bench: the measurement behind pdserve's HTTP server library
// (DESIGN.md, docs/openai.md "Why Boost.Beast"). Each candidate from Debian 12
// serves the same server-sent-events workload (K events of ~100 bytes, one
// every `interval`, like tokens) in a forked child process; a load client in
// this process opens N concurrent streams, reads them to the end and reports
// completion, wall time, event gaps, and the server's threads, peak RSS and CPU
// time read from /proc/PID. Single-threaded driver; the client runs its own
// io_context threads. The servers are in http_bench_servers.cc.
//
//   http_libs_bench [--n=100,1000] [--events=100] [--interval_ms=20]
//                   [--libs=beast,mhd,httplib,httplib_backlog,httplib_tuned]
//                   [--threads=2] [--deadline_s=600]
//   http_libs_bench --serve=LIB  (one server on its own; prints its port)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "tools/bench/http_bench_servers.h"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

using pdserve::http_bench::Serve;
using pdserve::http_bench::Workload;

// ---- Load client ------------------------------------------------------------

// One client stream: connect, send GET, count "\n\n"-terminated events in the
// body (each server writes one event per chunk) until EOF. Runs on a strand.
struct ClientStream {
  explicit ClientStream(net::io_context& ioc) : socket(net::make_strand(ioc)) {}
  tcp::socket socket;
  std::array<char, 8192> buf;
  std::string head;  // the response header until "\r\n\r\n"
  bool in_body = false, status_ok = false, done = false;
  char last = 0;
  int events = 0;
  std::string error;
  Clock::time_point start, last_event, end;
  double first_event_ms = -1;
  std::vector<double> gaps_ms;
};

// N concurrent streams to 127.0.0.1:port, read on `threads` io_context
// threads. Its methods are for one driver thread; streams() is final once
// Finish has returned.
class LoadClient {
 public:
  LoadClient(int n, int port, int threads) : port_(port), threads_(threads) {
    for (int i = 0; i < n; ++i) {
      streams_.push_back(std::make_unique<ClientStream>(ioc_));
    }
  }
  void Start() {
    for (auto& s : streams_) Connect(s.get());
    for (int i = 0; i < threads_; ++i) pool_.emplace_back([&] { ioc_.run(); });
  }
  int finished() const { return finished_.load(); }
  // Cuts every stream still open (deadline), then waits for the threads.
  void Finish() {
    cut_at_ = Clock::now();
    for (auto& s : streams_) {
      net::post(s->socket.get_executor(), [s = s.get()] {
        beast::error_code ec;
        s->socket.close(ec);
      });
    }
    for (auto& t : pool_) t.join();
  }
  const std::vector<std::unique_ptr<ClientStream>>& streams() const {
    return streams_;
  }
  // When Finish began to close the streams still open.
  Clock::time_point cut_at() const { return cut_at_; }

 private:
  void Connect(ClientStream* s) {
    s->start = Clock::now();
    s->socket.async_connect(
        {net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port_)},
        [this, s](beast::error_code ec) {
          if (ec) return End(s, "connect: " + ec.message());
          net::async_write(s->socket, net::buffer(kRequest),
                           [this, s](beast::error_code ec, size_t) {
                             if (ec) return End(s, "write: " + ec.message());
                             Read(s);
                           });
        });
  }
  void Read(ClientStream* s) {
    s->socket.async_read_some(
        net::buffer(s->buf), [this, s](beast::error_code ec, size_t n) {
          if (ec) return End(s, ec == net::error::eof ? "" : ec.message());
          OnBytes(s, std::string_view(s->buf.data(), n), Clock::now());
          Read(s);
        });
  }
  static void OnBytes(ClientStream* s, std::string_view bytes,
                      Clock::time_point now) {
    if (!s->in_body) {
      s->head.append(bytes);
      const size_t end = s->head.find("\r\n\r\n");
      if (end == std::string::npos) return;
      s->in_body = true;
      s->status_ok = s->head.rfind("HTTP/1.1 200", 0) == 0;
      bytes = std::string_view(s->head).substr(end + 4);
    }
    for (char c : bytes) {
      if (c == '\n' && s->last == '\n') {
        if (s->events == 0) {
          s->first_event_ms = Ms(now - s->start);
        } else {
          s->gaps_ms.push_back(Ms(now - s->last_event));
        }
        s->last_event = now;
        ++s->events;
        c = 0;
      }
      s->last = c;
    }
  }
  void End(ClientStream* s, std::string error) {
    s->end = Clock::now();
    s->error = std::move(error);
    s->done = true;
    ++finished_;
  }
  static double Ms(Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  }

  static constexpr std::string_view kRequest =
      "GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
      "Connection: close\r\n\r\n";
  const int port_, threads_;
  net::io_context ioc_;
  std::vector<std::unique_ptr<ClientStream>> streams_;
  std::vector<std::thread> pool_;
  std::atomic<int> finished_{0};
  Clock::time_point cut_at_ = Clock::time_point::max();
};

// ---- Driver -----------------------------------------------------------------

struct ProcStats {
  int threads = 0;
  double hwm_mib = 0, cpu_s = 0;
};

ProcStats ReadProc(pid_t pid) {
  ProcStats p;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) p.threads = std::atoi(line.c_str() + 8);
    if (line.rfind("VmHWM:", 0) == 0)
      p.hwm_mib = std::atof(line.c_str() + 6) / 1024;
  }
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(stat)), {});
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::string field;
  long ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::atol(field.c_str());  // utime + stime
  }
  p.cpu_s = static_cast<double>(ticks) / sysconf(_SC_CLK_TCK);
  return p;
}

// TcpExt ListenOverflows: handshakes dropped because a listen queue was full
// (this network namespace; the client retransmits its SYN after 1, 3, 7... s).
long ListenOverflows() {
  std::ifstream in("/proc/net/netstat");
  std::string names, values;
  while (std::getline(in, names) && std::getline(in, values)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    for (std::string name, value; n >> name && v >> value;) {
      if (name == "ListenOverflows") return std::atol(value.c_str());
    }
  }
  return 0;
}

double CpuSecondsSelf() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

void RunOne(const std::string& lib, int n, const Workload& w,
            double deadline_s) {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  const pid_t pid = fork();  // before this process starts any thread
  if (pid == 0) {
    close(fds[0]);
    Serve(lib, fds[1], w, n);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port)) {
    std::printf("| %s | %d | server failed to start |\n", lib.c_str(), n);
    waitpid(pid, nullptr, 0);
    return;
  }
  close(fds[0]);
  // Idle: once the server's thread count has settled (a big pool takes a
  // while to start).
  ProcStats idle = ReadProc(pid);
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int before = idle.threads;
    idle = ReadProc(pid);
    if (idle.threads == before) break;
  }
  const long overflows_before = ListenOverflows();
  const double client_cpu_before = CpuSecondsSelf();

  LoadClient client(n, port, 2);
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(deadline_s));
  client.Start();
  int max_threads = idle.threads;
  while (client.finished() < n && Clock::now() < deadline) {
    max_threads = std::max(max_threads, ReadProc(pid).threads);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const bool cut = client.finished() < n;
  client.Finish();
  const ProcStats after = ReadProc(pid);
  const double client_cpu = CpuSecondsSelf() - client_cpu_before;
  const long overflows = ListenOverflows() - overflows_before;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);

  int completed = 0, events = 0;
  Clock::time_point last_end = start;
  std::vector<double> first, gaps;
  std::map<std::string, int> errors;
  for (const auto& s : client.streams()) {
    events += s->events;
    if (s->first_event_ms >= 0) first.push_back(s->first_event_ms);
    gaps.insert(gaps.end(), s->gaps_ms.begin(), s->gaps_ms.end());
    if (s->done && s->error.empty() && s->status_ok && s->events == w.events) {
      ++completed;
      last_end = std::max(last_end, s->end);
    } else {
      ++errors[s->end >= client.cut_at() ? "cut at deadline"
               : !s->error.empty()       ? s->error
                                         : "incomplete or not 200"];
    }
  }
  const double wall =
      std::chrono::duration<double>((cut ? client.cut_at() : last_end) - start)
          .count();
  std::string notes;
  if (overflows > 0) {
    notes += std::to_string(overflows) + " listen queue overflows; ";
  }
  for (const auto& [e, count] : errors) {
    notes += std::to_string(count) + " " + e + "; ";
  }
  std::printf(
      "| %s | %d | %d | %s%.2f | %.0f | %.0f / %.0f | %.1f / %.1f | %d / %d | "
      "%.1f | %.2f | %.2f | %s|\n",
      lib.c_str(), n, completed, cut ? ">" : "", wall, events / wall,
      Percentile(first, 0.5), Percentile(first, 0.99), Percentile(gaps, 0.5),
      Percentile(gaps, 0.99), idle.threads, max_threads, after.hwm_mib,
      after.cpu_s - idle.cpu_s, client_cpu, notes.c_str());
  std::fflush(stdout);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"n", "100,1000"},
      {"events", "100"},
      {"interval_ms", "20"},
      {"libs", "beast,mhd,httplib,httplib_backlog,httplib_tuned"},
      {"threads", "2"},
      {"deadline_s", "600"},
      {"serve", ""}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos ||
        !flags.count(arg.substr(2, eq - 2))) {
      std::fprintf(stderr, "unknown flag %s (see the file comment)\n", argv[i]);
      return 2;
    }
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  Workload w;
  w.events = std::stoi(flags["events"]);
  w.interval = std::chrono::milliseconds(std::stoi(flags["interval_ms"]));
  w.threads = std::stoi(flags["threads"]);
  if (!flags["serve"].empty()) Serve(flags["serve"], -1, w, 0);

  // 1,000 client sockets here and 1,000 in the server child.
  rlimit nofile;
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);
  signal(SIGPIPE, SIG_IGN);

  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::printf(
      "%d events x %d ms per stream (ideal %.2f s), server threads=%d, "
      "RLIMIT_NOFILE=%ld, load average %.2f %.2f %.2f\n\n",
      w.events, static_cast<int>(w.interval.count()),
      (w.events - 1) * w.interval.count() / 1000.0, w.threads,
      static_cast<long>(nofile.rlim_cur), load[0], load[1], load[2]);
  std::printf(
      "| library | N | completed | wall s | events/s | first event p50 / p99 "
      "ms | gap p50 / p99 ms | server threads idle / max | server peak RSS "
      "MiB | server CPU s | client CPU s | notes |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
      "|\n");
  for (const std::string& n : Split(flags["n"])) {
    for (const std::string& lib : Split(flags["libs"])) {
      RunOne(lib, std::stoi(n), w, std::stod(flags["deadline_s"]));
    }
  }
  getloadavg(load, 3);
  std::printf("\nload average after: %.2f %.2f %.2f\n", load[0], load[1],
              load[2]);
  return 0;
}
