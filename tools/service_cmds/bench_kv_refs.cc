#include "tools/service_cmds/bench_kv_refs.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/util/net.h"
#include "common/util/scoped_env.h"
#include "common/util/status_macros.h"
#include "common/util/subprocess.h"

namespace pdserve {

absl::Status TcpOnce(const std::string& src, std::string* dst) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 ||
      bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) close(listener);
    return absl::InternalError(absl::StrCat("listen: ", strerror(errno)));
  }
  bool received = false;
  std::thread receiver([&] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    size_t got = 0;
    while (got < dst->size()) {
      ssize_t r = read(fd, dst->data() + got,
                       std::min<size_t>(dst->size() - got, 4 << 20));
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    received = got == dst->size();
    char ack = 1;
    (void)!write(fd, &ack, 1);
    close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  absl::Status status;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    status = absl::InternalError(absl::StrCat("connect: ", strerror(errno)));
  } else {
    size_t sent = 0;
    while (sent < src.size()) {
      ssize_t w = write(fd, src.data() + sent,
                        std::min<size_t>(src.size() - sent, 4 << 20));
      if (w <= 0) break;
      sent += static_cast<size_t>(w);
    }
    char ack = 0;
    if (read(fd, &ack, 1) != 1) status = absl::InternalError("no TCP ack");
  }
  close(fd);
  receiver.join();
  close(listener);
  if (status.ok() && !received) status = absl::InternalError("short TCP read");
  return status;
}

namespace {

std::string FindInPath(const std::string& name) {
  const char* path = getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<double> UcxPerftestGbps(const std::string& test,
                                       int64_t message_bytes, int iterations,
                                       const std::string& tls) {
  const std::string bin = FindInPath("ucx_perftest");
  if (bin.empty()) {
    return absl::NotFoundError(
        "ucx_perftest not found (Debian package ucx-utils)");
  }
  ASSIGN_OR_RETURN(const std::string dir,
                   MakeTempDirectory("pdserve-perftest-"));
  const std::string out = dir + "/client.out";
  absl::StatusOr<double> result = absl::UnavailableError("not run");
  ScopedEnv env("UCX_TLS", tls);
  // The server may take a moment to listen: retry the client with a fresh
  // server on a fresh port a few times.
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto port = PickFreePort();
    if (!port.ok()) {
      result = port.status();
      break;
    }
    SubprocessOptions quiet;
    quiet.stdout_path = dir + "/server.out";
    quiet.stderr_path = quiet.stdout_path;
    auto server = Subprocess::Start({bin, "-p", absl::StrCat(*port)}, quiet);
    if (!server.ok()) {
      result = server.status();
      break;
    }
    absl::SleepFor(absl::Milliseconds(300));
    SubprocessOptions so;
    so.stdout_path = out;
    so.stderr_path = dir + "/client.err";
    unlink(out.c_str());
    auto client =
        Subprocess::Start({bin, "127.0.0.1", "-p", absl::StrCat(*port), "-t",
                           test, "-s", absl::StrCat(message_bytes), "-n",
                           absl::StrCat(iterations), "-w", "10", "-f"},
                          so);
    if (!client.ok()) {
      result = client.status();
      break;
    }
    auto st = client->Wait(absl::Seconds(120));
    (void)server->Wait(absl::Seconds(5));  // Subprocess kills it otherwise
    if (!st.ok() || !WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
      result = absl::UnavailableError(
          absl::StrCat("ucx_perftest ", test, " failed: ", ReadAll(out),
                       ReadAll(dir + "/client.err")));
      continue;
    }
    // With -f the last line holds: iterations, latency typical / average /
    // overall (us), bandwidth average / overall (MB/s = 2^20 bytes/s),
    // message rate average / overall.
    std::vector<double> numbers;
    for (absl::string_view line : absl::StrSplit(ReadAll(out), '\n')) {
      std::vector<double> row;
      for (absl::string_view w :
           absl::StrSplit(line, absl::ByAnyChar(" \t|"), absl::SkipEmpty())) {
        double v;
        if (absl::SimpleAtod(w, &v)) row.push_back(v);
      }
      if (row.size() == 8) numbers = row;
    }
    if (numbers.empty()) {
      result = absl::InternalError("ucx_perftest printed no result: " +
                                   ReadAll(out));
    } else {
      result = numbers[5] * 1048576.0 / 1e9;
    }
    break;
  }
  for (const char* f : {"/client.out", "/client.err", "/server.out"}) {
    unlink((dir + f).c_str());
  }
  rmdir(dir.c_str());
  return result;
}

}  // namespace pdserve
