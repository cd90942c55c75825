// `pdserve bench-kv-transfer`: loopback bandwidth of one prompt's KV moved
// (a) by the gRPC KV push (real KvTransferService, a sink that copies every
// chunk into a destination buffer, as D's import does), (b) by the
// shared-memory KV push (same service and sink; "shm" reuses the sender's
// pooled segment as a busy worker does, "shm-cold" creates a segment per
// push), (c) over a plain TCP loopback socket, (d) by memcpy — the same
// bytes, in the same run, so the transports read as ratios to memcpy. Pushes
// are chunked, sealed (XXH3) and verified exactly as in the service, by one
// sending thread. Also times the setup of one shared-memory segment of that
// size (create + fallocate + map + unlink).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/model/model_source.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_wire.h"
#include "common/transport/shm_kv_transport.h"
#include "common/transport/shm_segment.h"
#include "common/util/malloc_tuning.h"
#include "nlohmann/json.hpp"
#include "tools/common_flags.h"
#include "tools/subcommand.h"

ABSL_FLAG(std::string, kv_bench_model, "synthetic:llama-110m",
          "bench-kv-transfer: model whose KV shape sizes the transfer (a "
          "directory or synthetic:NAME; KV dtype from --kv_dtype/--dtype)");
ABSL_FLAG(int32_t, kv_bench_tokens, 2048,
          "bench-kv-transfer: prompt tokens whose KV is moved");
ABSL_FLAG(int32_t, kv_bench_repeats, 5,
          "bench-kv-transfer: repetitions of each measurement");
ABSL_FLAG(std::vector<std::string>, kv_bench_paths,
          std::vector<std::string>({"memcpy", "tcp", "grpc", "shm",
                                    "shm-cold"}),
          "bench-kv-transfer: what to measure (memcpy always runs first: the "
          "ratios need it)");

namespace pdserve {
namespace {

namespace pb = ::pdserve::v1::internal;

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Progress(const std::string& text) {
  std::fprintf(stderr, "\r\033[Kbench-kv-transfer: %s", text.c_str());
  std::fflush(stderr);
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "\nbench-kv-transfer: %s\n", message.c_str());
  return 1;
}

// Receiving side: every chunk is copied into `dst` at its layer/token place.
class CopyingSinkFactory : public transport::KvSinkFactory {
 public:
  CopyingSinkFactory(const KvLayout& layout, int tokens, std::string* dst)
      : layout_(layout), tokens_(tokens), dst_(dst) {}
  class Sink : public transport::KvSink {
   public:
    explicit Sink(CopyingSinkFactory* f) : f_(f) {}
    absl::Status OnChunk(const transport::KvChunkView& c) override {
      const int64_t bpt = f_->layout_.BytesPerTokenPerLayer();
      const int64_t at = (int64_t{c.layer} * f_->tokens_ + c.token_begin) * bpt;
      std::memcpy(f_->dst_->data() + at, c.data.data(), c.data.size());
      return absl::OkStatus();
    }
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
  const std::string fingerprint_ = "bench-kv-transfer";
};

// One push of `src` (layer-major), chunked and sealed as a prefill does.
absl::Status PushOnce(transport::KvSender& sender, const std::string& target,
                      const KvLayout& layout, int tokens,
                      const std::string& src, const std::string& want) {
  pb::KvHeader header;
  header.set_request_id("bench");
  header.set_model_fingerprint("bench-kv-transfer");
  *header.mutable_layout() = transport::LayoutToProto(layout);
  header.set_num_tokens(tokens);
  auto stream = sender.Open(target, header, absl::Now() + absl::Seconds(120));
  if (!stream.ok()) return stream.status();
  const int64_t bpt = layout.BytesPerTokenPerLayer();
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (auto [b, e] : transport::ChunkTokenRanges(
             0, tokens, bpt, transport::kKvChunkTargetBytes)) {
      pb::KvChunk c;
      c.set_layer(layer);
      c.set_token_begin(b);
      c.set_token_end(e);
      c.set_data(src.data() + (int64_t{layer} * tokens + b) * bpt,
                 (e - b) * bpt);
      transport::SealChunk(&c);
      if (absl::Status s = (*stream)->Send(std::move(c)); !s.ok()) return s;
    }
  }
  auto result = (*stream)->Commit(pb::KvCommit());
  if (!result.ok()) return result.status();
  if (result->transport != want) {
    return absl::InternalError(
        absl::StrCat("push went over ", result->transport, ", not ", want));
  }
  return absl::OkStatus();
}

// Sends `src` over a fresh TCP loopback connection; the receiver reads it
// all into `dst` and answers one byte.
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

struct Figure {
  std::string name;
  double best_seconds = 0;
  double mean_seconds = 0;
};

absl::StatusOr<Figure> Measure(const std::string& name, int repeats,
                               const std::function<absl::Status()>& once) {
  Figure f{name, 1e30, 0};
  for (int i = 0; i < repeats; ++i) {
    Progress(absl::StrCat(name, " ", i + 1, "/", repeats));
    const double t0 = Now();
    if (absl::Status s = once(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
    }
    const double dt = Now() - t0;
    f.best_seconds = std::min(f.best_seconds, dt);
    f.mean_seconds += dt / repeats;
  }
  return f;
}

absl::StatusOr<KvLayout> BenchLayout() {
  const std::string model = absl::GetFlag(FLAGS_kv_bench_model);
  ModelConfig config;
  if (absl::StartsWith(model, "synthetic:")) {
    auto c = SyntheticConfig(model.substr(10));
    if (!c.ok()) return c.status();
    config = *c;
  } else {
    auto source = OpenModelSource(model, DType::kF32, 0);
    if (!source.ok()) return source.status();
    config = (*source)->config();
  }
  std::string kv = absl::GetFlag(FLAGS_kv_dtype);
  if (kv == "auto") kv = absl::GetFlag(FLAGS_dtype);
  auto dtype = ParseComputeDType(kv);
  if (!dtype.ok()) return dtype.status();
  KvLayout l;
  l.num_layers = config.num_layers;
  l.num_kv_heads = config.num_kv_heads;
  l.head_dim = config.head_dim;
  l.block_size = absl::GetFlag(FLAGS_block_size);
  l.dtype = *dtype;
  return l;
}

int RunBenchKvTransfer(const std::vector<std::string>&) {
  TuneMallocForLargeBuffers();  // as the prefill and decode workers do
  auto layout = BenchLayout();
  if (!layout.ok()) return Fail(layout.status().ToString());
  const int tokens = absl::GetFlag(FLAGS_kv_bench_tokens);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_kv_bench_repeats));
  if (tokens <= 0) return Fail("--kv_bench_tokens must be positive");
  const int64_t bytes =
      layout->BytesPerTokenPerLayer() * tokens * layout->num_layers;
  Progress(absl::StrFormat(
      "%d layers x 2 x %d kv heads x %d x %d bytes x %d "
      "tokens = %.1f MB",
      layout->num_layers, layout->num_kv_heads, layout->head_dim,
      DTypeSize(layout->dtype), tokens, bytes / 1e6));
  std::string src(static_cast<size_t>(bytes), '\0');
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= src.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(src.data() + i, &v, 8);
  }
  std::string dst(src.size(), '\0');

  CopyingSinkFactory factory(*layout, tokens, &dst);
  transport::KvTransferService service(&factory, /*accept_shm=*/true);
  ServerOptions so;
  so.address = "127.0.0.1:0";
  so.services = {&service};
  auto server = StartServer(so);
  if (!server.ok()) return Fail(server.status().ToString());
  const std::string target = absl::StrCat("127.0.0.1:", server->port);
  transport::GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  transport::ShmKvSender shm(&grpc, transport::KvTransportMode::kShm);

  std::vector<Figure> figures;
  auto run = [&](const std::string& name,
                 const std::function<absl::Status()>& once) {
    std::fill(dst.begin(), dst.end(), '\0');
    auto f = Measure(name, repeats, once);
    if (!f.ok()) return f.status();
    if (dst != src) return absl::DataLossError(name + ": bytes differ");
    figures.push_back(*f);
    return absl::OkStatus();
  };
  absl::Status s = run("memcpy", [&] {
    std::memcpy(dst.data(), src.data(), src.size());
    return absl::OkStatus();
  });
  const std::vector<std::string> paths = absl::GetFlag(FLAGS_kv_bench_paths);
  auto wanted = [&](const std::string& p) {
    return std::find(paths.begin(), paths.end(), p) != paths.end();
  };
  if (s.ok() && wanted("tcp")) {
    s = run("tcp", [&] { return TcpOnce(src, &dst); });
  }
  if (s.ok() && wanted("grpc")) {
    s = run("grpc", [&] {
      return PushOnce(grpc, target, *layout, tokens, src, "grpc");
    });
  }
  if (s.ok() && wanted("shm")) {
    s = run("shm",
            [&] { return PushOnce(shm, target, *layout, tokens, src, "shm"); });
  }
  if (s.ok() && wanted("shm-cold")) {
    // A fresh sender per push: no pooled segment, every push creates one.
    s = run("shm-cold", [&] {
      transport::ShmKvSender cold(&grpc, transport::KvTransportMode::kShm);
      return PushOnce(cold, target, *layout, tokens, src, "shm");
    });
  }
  // Setup cost of one segment per push (what the shm figure includes).
  absl::StatusOr<Figure> setup = Measure("shm segment setup", repeats, [&] {
    auto seg = transport::ShmSegment::Create(transport::kShmKvPrefix, bytes);
    return seg.status();
  });
  server->server->Shutdown();
  std::fprintf(stderr, "\r\033[K");
  if (!s.ok()) return Fail(s.ToString());
  if (!setup.ok()) return Fail(setup.status().ToString());

  const double memcpy_gbps = bytes / figures[0].best_seconds / 1e9;
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json j;
    j["model"] = absl::GetFlag(FLAGS_kv_bench_model);
    j["tokens"] = tokens;
    j["bytes"] = bytes;
    j["repeats"] = repeats;
    for (const Figure& f : figures) {
      j["results"][f.name] = {
          {"best_gbps", bytes / f.best_seconds / 1e9},
          {"mean_gbps", bytes / f.mean_seconds / 1e9},
          {"ratio_to_memcpy", bytes / f.best_seconds / 1e9 / memcpy_gbps}};
    }
    j["shm_segment_setup_seconds"] = setup->best_seconds;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "KV of %s, %d tokens: %d layers x 2 x %d kv heads x %d dims x "
      "%d bytes = %.1f MB, %d repeats\n",
      absl::GetFlag(FLAGS_kv_bench_model).c_str(), tokens, layout->num_layers,
      layout->num_kv_heads, layout->head_dim, DTypeSize(layout->dtype),
      bytes / 1e6, repeats);
  std::printf("%-9s %12s %12s %10s\n", "path", "best GB/s", "mean GB/s",
              "vs memcpy");
  for (const Figure& f : figures) {
    const double best = bytes / f.best_seconds / 1e9;
    std::printf("%-9s %12.2f %12.2f %9.3fx\n", f.name.c_str(), best,
                bytes / f.mean_seconds / 1e9, best / memcpy_gbps);
  }
  std::printf("shm segment setup (create+fallocate+map+unlink): %.1f ms\n",
              setup->best_seconds * 1e3);
  return 0;
}

PDSERVE_SUBCOMMAND(
    "bench-kv-transfer",
    "loopback KV transfer bandwidth: gRPC push, shm push, TCP, memcpy",
    "pdserve bench-kv-transfer [--kv_bench_model=synthetic:llama-110m] "
    "[--kv_bench_tokens=2048] [--kv_bench_repeats=5] [--json]",
    RunBenchKvTransfer);

}  // namespace
}  // namespace pdserve
