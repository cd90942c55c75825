#include "tools/service_cmds/bench_kv_receiver.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/grpc_util/grpc_util.h"
#include "common/kv/kv_cache.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/ucx_kv_receiver.h"
#include "common/transport/ucx_worker.h"
#include "common/util/checksum.h"

namespace pdserve {
namespace {

namespace pb = ::pdserve::v1::internal;

// Every chunk is copied into `dst` at its layer/token place.
class CopyingSinkFactory : public transport::KvSinkFactory {
 public:
  CopyingSinkFactory(const KvLayout& layout, int tokens, std::string* dst)
      : layout_(layout), tokens_(tokens), dst_(dst) {}
  class Sink : public transport::KvSink {
   public:
    explicit Sink(CopyingSinkFactory* f) : f_(f) {}
    // Hashes while copying, with the stores the decode worker's import
    // uses for a chunk of this size.
    absl::Status OnChunk(const transport::KvChunkView& c,
                         uint64_t* xxh3) override {
      const int64_t bpt = f_->layout_.BytesPerTokenPerLayer();
      const int64_t at = (int64_t{c.layer} * f_->tokens_ + c.token_begin) * bpt;
      *xxh3 = CopyWithXxh3(f_->dst_->data() + at, c.data.data(), c.data.size(),
                           KvCache::ImportStores(c.data.size()));
      return absl::OkStatus();
    }
    bool HashesChunks() const override { return true; }
    absl::Status OnCommit(const pb::KvCommit&, double) override {
      return absl::OkStatus();
    }
    void OnAbort(const absl::Status&) override {}

   private:
    CopyingSinkFactory* f_;
  };
  absl::StatusOr<std::unique_ptr<transport::KvSink>> Begin(
      const pb::KvHeader&, std::function<void()>) override {
    return std::make_unique<Sink>(this);
  }
  const std::string& fingerprint() const override { return fingerprint_; }
  KvLayout layout() const override { return layout_; }

 private:
  const KvLayout layout_;
  const int tokens_;
  std::string* const dst_;
  const std::string fingerprint_ = kKvBenchFingerprint;
};

// A receiving service on its own loopback port.
struct Service {
  std::unique_ptr<transport::UcxWorker> worker;
  std::unique_ptr<transport::UcxKvReceiver> receiver;
  std::unique_ptr<transport::KvTransferService> service;
  StartedServer server;
};

absl::StatusOr<std::unique_ptr<Service>> StartService(
    transport::KvSinkFactory* factory, bool ucx, const std::string& tls) {
  auto s = std::make_unique<Service>();
  transport::KvReceiveOptions o;
  if (ucx) {
    if (tls.empty()) {
      unsetenv("UCX_TLS");
    } else {
      setenv("UCX_TLS", tls.c_str(), 1);
    }
    auto w = transport::UcxWorker::Create();
    unsetenv("UCX_TLS");
    if (!w.ok()) return w.status();
    s->worker = *std::move(w);
    s->receiver = std::make_unique<transport::UcxKvReceiver>(
        s->worker.get(), transport::kKvChunkTargetBytes);
    o.ucx = s->receiver.get();
  }
  s->service = std::make_unique<transport::KvTransferService>(factory, o);
  ServerOptions so;
  so.address = "127.0.0.1:0";
  so.services = {s->service.get()};
  auto server = StartServer(so);
  if (!server.ok()) return server.status();
  s->server = *std::move(server);
  return s;
}

void WriteLine(int fd, const std::string& line) {
  const std::string text = line + "\n";
  (void)!write(fd, text.data(), text.size());
}

std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

[[noreturn]] void ReceiverMain(const KvLayout& layout, int tokens,
                               const std::string& expected, bool ucx,
                               bool ucx_tcp, int fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::string dst(expected.size(), '\0');
  CopyingSinkFactory factory(layout, tokens, &dst);
  // UCX_TLS as the parent had it applies to the default-transport service.
  const char* env_tls = getenv("UCX_TLS");
  const std::string default_tls = env_tls != nullptr ? env_tls : "";
  std::vector<std::unique_ptr<Service>> services;
  std::vector<std::string> ports;
  for (auto [on, use_ucx, tls] :
       {std::tuple<bool, bool, std::string>{true, false, ""},
        {ucx, true, default_tls},
        {ucx_tcp, true, "tcp"}}) {
    if (!on) {
      ports.push_back("0");
      continue;
    }
    auto s = StartService(&factory, use_ucx, tls);
    if (!s.ok()) {
      WriteLine(fd, absl::StrCat("error ", s.status().ToString()));
      _exit(1);
    }
    ports.push_back(absl::StrCat((*s)->server.port));
    services.push_back(*std::move(s));
  }
  WriteLine(fd, absl::StrJoin(ports, " "));
  while (true) {
    const std::string cmd = ReadLine(fd);
    if (cmd != "verify") break;  // the parent is gone or done
    WriteLine(fd, dst == expected ? "ok" : "differ");
  }
  _exit(0);
}

}  // namespace

absl::StatusOr<KvBenchReceiver> StartKvBenchReceiver(
    const KvLayout& layout, int tokens, const std::string& expected, bool ucx,
    bool ucx_tcp) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    close(fds[0]);
    ReceiverMain(layout, tokens, expected, ucx, ucx_tcp, fds[1]);
  }
  close(fds[1]);
  KvBenchReceiver r;
  r.pid = pid;
  r.control_fd = fds[0];
  const std::string line = ReadLine(r.control_fd);
  std::vector<std::string> ports = absl::StrSplit(line, ' ');
  if (ports.size() != 3 || ports[0] == "error") {
    StopKvBenchReceiver(r);
    return absl::InternalError("bench receiver: " + line);
  }
  r.target = "127.0.0.1:" + ports[0];
  if (ucx) r.ucx_target = "127.0.0.1:" + ports[1];
  if (ucx_tcp) r.ucx_tcp_target = "127.0.0.1:" + ports[2];
  return r;
}

absl::Status VerifyKvBenchReceiver(const KvBenchReceiver& r) {
  WriteLine(r.control_fd, "verify");
  const std::string answer = ReadLine(r.control_fd);
  if (answer == "ok") return absl::OkStatus();
  return absl::DataLossError("the receiver's bytes differ from the source (" +
                             answer + ")");
}

double CpuSecondsOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces): state is field 3,
  // utime 14 and stime 15 (clock ticks).
  const size_t close_paren = text.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::vector<std::string> f =
      absl::StrSplit(text.substr(close_paren + 2), ' ');
  double utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtod(f[11], &utime) ||
      !absl::SimpleAtod(f[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

void StopKvBenchReceiver(KvBenchReceiver& r) {
  if (r.pid > 0) {
    kill(r.pid, SIGKILL);
    waitpid(r.pid, nullptr, 0);
    r.pid = -1;
  }
  if (r.control_fd >= 0) close(r.control_fd);
  r.control_fd = -1;
}

}  // namespace pdserve
