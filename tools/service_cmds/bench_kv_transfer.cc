// `pdserve bench-kv-transfer`: loopback bandwidth of one prompt's KV moved
// (a) by the gRPC KV push (real KvTransferService, a sink that copies every
// chunk into a destination buffer, as D's import does), (b) by the
// shared-memory KV push (same service and sink; "shm" reuses the sender's
// pooled segment as a busy worker does, "shm-cold" creates a segment per
// push), (c) by the UCX KV push (same service and sink; D reads each chunk
// from P's registered region with a UCX get: "ucx" with UCX's default
// transports, "ucx-tcp" with UCX_TLS=tcp; P and D have a UCX worker each),
// (d) over a plain TCP loopback socket, (e) by memcpy, and (f) by UCX's own
// ucx_perftest (two processes; tag_bw and ucp_get at the pushes' chunk size,
// default transports and tcp) — the same bytes, in the same run. The paths
// run in turn, round after round (this machine's bandwidth drifts between
// runs, so each ratio is taken within a round; medians over the rounds).
// Pushes are chunked, sealed (XXH3) and verified exactly as in the service,
// by one sending thread.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
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
#include "common/transport/ucx_kv_receiver.h"
#include "common/transport/ucx_kv_sender.h"
#include "common/transport/ucx_worker.h"
#include "common/util/malloc_tuning.h"
#include "nlohmann/json.hpp"
#include "tools/common_flags.h"
#include "tools/service_cmds/bench_kv_refs.h"
#include "tools/subcommand.h"

ABSL_FLAG(std::string, kv_bench_model, "synthetic:llama-110m",
          "bench-kv-transfer: model whose KV shape sizes the transfer (a "
          "directory or synthetic:NAME; KV dtype from --kv_dtype/--dtype)");
ABSL_FLAG(int32_t, kv_bench_tokens, 2048,
          "bench-kv-transfer: prompt tokens whose KV is moved");
ABSL_FLAG(int32_t, kv_bench_repeats, 5,
          "bench-kv-transfer: rounds (every path runs once per round)");
ABSL_FLAG(std::vector<std::string>, kv_bench_paths,
          std::vector<std::string>({"memcpy", "tcp", "grpc", "shm", "shm-cold",
                                    "ucx", "ucx-tcp", "ucx_perftest",
                                    "ucx_perftest-tcp"}),
          "bench-kv-transfer: what to measure (memcpy always runs: the ratios "
          "need it). ucx_perftest[-tcp] runs tag_bw, ucp_put_bw and ucp_get.");

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

// A receiving service on loopback (its own gRPC server).
struct Receiver {
  std::unique_ptr<transport::KvTransferService> service;
  StartedServer server;
  std::string target;
};

absl::StatusOr<std::unique_ptr<Receiver>> StartReceiver(
    transport::KvSinkFactory* factory, transport::KvReceiveOptions options) {
  auto r = std::make_unique<Receiver>();
  r->service = std::make_unique<transport::KvTransferService>(factory, options);
  ServerOptions so;
  so.address = "127.0.0.1:0";
  so.services = {r->service.get()};
  auto server = StartServer(so);
  if (!server.ok()) return server.status();
  r->server = *std::move(server);
  r->target = absl::StrCat("127.0.0.1:", r->server.port);
  return r;
}

// A UCX pair as two workers would have: P's worker and sender, D's worker,
// receiver and service, created with UCX_TLS=`tls` ("" = default).
struct UcxPair {
  std::unique_ptr<transport::UcxWorker> p_worker, d_worker;
  std::unique_ptr<transport::UcxKvReceiver> receiver;
  std::unique_ptr<Receiver> service;
  std::unique_ptr<transport::UcxKvSender> sender;
  ~UcxPair() {
    sender.reset();
    service.reset();
    receiver.reset();
  }
};

absl::StatusOr<std::unique_ptr<UcxPair>> StartUcxPair(
    const std::string& tls, transport::GrpcKvSender* grpc,
    transport::KvSinkFactory* factory, int64_t max_chunk) {
  const char* old = getenv("UCX_TLS");
  const std::string saved = old != nullptr ? old : "";
  if (tls.empty()) {
    unsetenv("UCX_TLS");
  } else {
    setenv("UCX_TLS", tls.c_str(), 1);
  }
  auto pair = std::make_unique<UcxPair>();
  auto p = transport::UcxWorker::Create();
  auto d = transport::UcxWorker::Create();
  if (old != nullptr) {
    setenv("UCX_TLS", saved.c_str(), 1);
  } else {
    unsetenv("UCX_TLS");
  }
  if (!p.ok()) return p.status();
  if (!d.ok()) return d.status();
  pair->p_worker = *std::move(p);
  pair->d_worker = *std::move(d);
  pair->receiver = std::make_unique<transport::UcxKvReceiver>(
      pair->d_worker.get(), max_chunk);
  transport::KvReceiveOptions options;
  options.accept_shm = false;
  options.ucx = pair->receiver.get();
  auto service = StartReceiver(factory, options);
  if (!service.ok()) return service.status();
  pair->service = *std::move(service);
  pair->sender = std::make_unique<transport::UcxKvSender>(
      grpc, pair->p_worker.get(), nullptr);
  return pair;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One measured path: `run` returns GB/s (it times itself).
struct Path {
  Path(std::string n, std::string ref,
       std::function<absl::StatusOr<double>()> f)
      : name(std::move(n)), reference(std::move(ref)), run(std::move(f)) {}
  std::string name;
  std::string reference;  // the row its "vs reference" ratio divides by
  std::function<absl::StatusOr<double>()> run;
  std::vector<double> gbps;   // per round
  std::vector<double> ratio;  // per round, to memcpy of the same round
};

int RunBenchKvTransfer(const std::vector<std::string>&) {
  TuneMallocForLargeBuffers();  // as the prefill and decode workers do
  auto layout = BenchLayout();
  if (!layout.ok()) return Fail(layout.status().ToString());
  const int tokens = absl::GetFlag(FLAGS_kv_bench_tokens);
  const int rounds = std::max(1, absl::GetFlag(FLAGS_kv_bench_repeats));
  if (tokens <= 0) return Fail("--kv_bench_tokens must be positive");
  const int64_t bpt = layout->BytesPerTokenPerLayer();
  const int64_t bytes = bpt * tokens * layout->num_layers;
  const auto ranges = transport::ChunkTokenRanges(
      0, tokens, bpt, transport::kKvChunkTargetBytes);
  const int64_t chunk_bytes = (ranges[0].second - ranges[0].first) * bpt;
  const int chunks = static_cast<int>(ranges.size()) * layout->num_layers;
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

  const std::vector<std::string> wanted_paths =
      absl::GetFlag(FLAGS_kv_bench_paths);
  auto wanted = [&](const std::string& p) {
    return std::find(wanted_paths.begin(), wanted_paths.end(), p) !=
           wanted_paths.end();
  };
  CopyingSinkFactory factory(*layout, tokens, &dst);
  auto main_rx = StartReceiver(&factory, transport::KvReceiveOptions());
  if (!main_rx.ok()) return Fail(main_rx.status().ToString());
  const std::string target = (*main_rx)->target;
  transport::GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  transport::ShmKvSender shm(&grpc, transport::KvTransportMode::kShm);
  std::map<std::string, std::unique_ptr<UcxPair>> ucx;
  for (const auto& [name, tls] :
       {std::pair<std::string, std::string>{"ucx", ""}, {"ucx-tcp", "tcp"}}) {
    if (!wanted(name)) continue;
    auto pair =
        StartUcxPair(tls, &grpc, &factory,
                     std::max(chunk_bytes, transport::kKvChunkTargetBytes));
    if (!pair.ok())
      return Fail(absl::StrCat(name, ": ", pair.status().ToString()));
    ucx[name] = *std::move(pair);
  }

  // Transfer paths time themselves and check the bytes.
  auto timed = [&](std::function<absl::Status()> once) {
    return [&, once]() -> absl::StatusOr<double> {
      std::fill(dst.begin(), dst.end(), '\0');
      const double t0 = Now();
      if (absl::Status s = once(); !s.ok()) return s;
      const double dt = Now() - t0;
      if (dst != src) return absl::DataLossError("bytes differ");
      return bytes / dt / 1e9;
    };
  };
  std::vector<Path> paths;
  paths.emplace_back("memcpy", "", timed([&] {
                       std::memcpy(dst.data(), src.data(), src.size());
                       return absl::OkStatus();
                     }));
  if (wanted("tcp")) {
    paths.emplace_back("tcp", "", timed([&] { return TcpOnce(src, &dst); }));
  }
  if (wanted("grpc")) {
    paths.emplace_back("grpc", "", timed([&] {
                         return PushOnce(grpc, target, *layout, tokens, src,
                                         "grpc");
                       }));
  }
  if (wanted("shm")) {
    paths.emplace_back("shm", "", timed([&] {
                         return PushOnce(shm, target, *layout, tokens, src,
                                         "shm");
                       }));
  }
  if (wanted("shm-cold")) {
    // A fresh sender per push: no pooled segment, every push creates one.
    paths.emplace_back(
        "shm-cold", "", timed([&] {
          transport::ShmKvSender cold(&grpc, transport::KvTransportMode::kShm);
          return PushOnce(cold, target, *layout, tokens, src, "shm");
        }));
  }
  for (const auto& [name, tls] :
       {std::pair<std::string, std::string>{"ucx", ""}, {"ucx-tcp", "tcp"}}) {
    if (ucx.count(name) == 0) continue;
    UcxPair* pair = ucx[name].get();
    const std::string ref =
        tls.empty() ? "ucx_perftest tag_bw" : "ucx_perftest tag_bw tcp";
    paths.emplace_back(name, ref, timed([&, pair] {
                         return PushOnce(*pair->sender, pair->service->target,
                                         *layout, tokens, src, "ucx");
                       }));
  }
  // UCX's own benchmark at the pushes' chunk size: about as many messages
  // as a push has chunks, 4 times over.
  for (const auto& [name, tls] :
       {std::pair<std::string, std::string>{"ucx_perftest", ""},
        {"ucx_perftest-tcp", "tcp"}}) {
    if (!wanted(name)) continue;
    for (const char* test : {"tag_bw", "ucp_put_bw", "ucp_get"}) {
      paths.emplace_back(
          absl::StrCat("ucx_perftest ", test, tls.empty() ? "" : " tcp"), "",
          [test, tls = tls, chunk_bytes, chunks] {
            return UcxPerftestGbps(test, chunk_bytes, std::max(40, 4 * chunks),
                                   tls);
          });
    }
  }

  for (int round = 0; round < rounds; ++round) {
    double memcpy_gbps = 0;
    for (Path& p : paths) {
      Progress(absl::StrCat("round ", round + 1, "/", rounds, ": ", p.name));
      auto g = p.run();
      if (!g.ok()) {
        return Fail(absl::StrCat(p.name, ": ", g.status().ToString()));
      }
      if (p.name == "memcpy") memcpy_gbps = *g;
      p.gbps.push_back(*g);
      p.ratio.push_back(*g / memcpy_gbps);
    }
  }
  // Setup cost of one shared-memory segment per push (shm-cold).
  double setup_seconds = 1e30;
  for (int i = 0; i < rounds; ++i) {
    const double t0 = Now();
    auto seg = transport::ShmSegment::Create(transport::kShmKvPrefix, bytes);
    if (!seg.ok()) return Fail(seg.status().ToString());
    seg->reset();
    setup_seconds = std::min(setup_seconds, Now() - t0);
  }
  ucx.clear();
  (*main_rx)->server.server->Shutdown();
  std::fprintf(stderr, "\r\033[K");

  // Ratio of a path to its reference row, per round, median.
  auto vs_reference = [&](const Path& p) -> double {
    for (const Path& r : paths) {
      if (r.name != p.reference) continue;
      std::vector<double> q;
      for (size_t i = 0; i < p.gbps.size(); ++i)
        q.push_back(p.gbps[i] / r.gbps[i]);
      return Median(q);
    }
    return 0;
  };
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json j;
    j["model"] = absl::GetFlag(FLAGS_kv_bench_model);
    j["tokens"] = tokens;
    j["bytes"] = bytes;
    j["chunk_bytes"] = chunk_bytes;
    j["rounds"] = rounds;
    for (const Path& p : paths) {
      j["results"][p.name] = {
          {"median_gbps", Median(p.gbps)},
          {"best_gbps", *std::max_element(p.gbps.begin(), p.gbps.end())},
          {"ratio_to_memcpy", Median(p.ratio)},
          {"gbps", p.gbps}};
      if (!p.reference.empty()) {
        j["results"][p.name]["reference"] = p.reference;
        j["results"][p.name]["ratio_to_reference"] = vs_reference(p);
      }
    }
    j["shm_segment_setup_seconds"] = setup_seconds;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "KV of %s, %d tokens: %d layers x 2 x %d kv heads x %d dims x "
      "%d bytes = %.1f MB in %d chunks of <= %.2f MB; %d rounds, paths "
      "alternating; medians\n",
      absl::GetFlag(FLAGS_kv_bench_model).c_str(), tokens, layout->num_layers,
      layout->num_kv_heads, layout->head_dim, DTypeSize(layout->dtype),
      bytes / 1e6, chunks, chunk_bytes / 1e6, rounds);
  std::printf("%-26s %10s %10s %10s  %s\n", "path", "GB/s", "best", "vs memcpy",
              "vs reference");
  for (const Path& p : paths) {
    std::string ref;
    if (!p.reference.empty()) {
      ref = absl::StrFormat("%.3fx %s", vs_reference(p), p.reference);
    }
    std::printf("%-26s %10.2f %10.2f %9.3fx  %s\n", p.name.c_str(),
                Median(p.gbps), *std::max_element(p.gbps.begin(), p.gbps.end()),
                Median(p.ratio), ref.c_str());
  }
  std::printf("shm segment setup (create+fallocate+map+unlink): %.1f ms\n",
              setup_seconds * 1e3);
  return 0;
}

PDSERVE_SUBCOMMAND(
    "bench-kv-transfer",
    "loopback KV transfer bandwidth: gRPC, shm and UCX pushes, TCP, memcpy, "
    "ucx_perftest",
    "pdserve bench-kv-transfer [--kv_bench_model=synthetic:llama-110m] "
    "[--kv_bench_tokens=2048] [--kv_bench_repeats=5] "
    "[--kv_bench_paths=memcpy,ucx,...] [--json]",
    RunBenchKvTransfer);

}  // namespace
}  // namespace pdserve
