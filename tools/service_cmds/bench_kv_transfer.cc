// `pdserve bench-kv-transfer`: loopback bandwidth of one prompt's KV moved
// from this process to a receiving process (forked: a real
// KvTransferService whose sink copies every chunk into a destination buffer,
// as D's import does) (a) by the gRPC KV push, (b) by the UCX KV push (P
// sends each chunk as a tagged message from its registered ring, D receives
// it into its registered landing buffer: "ucx" with UCX's default
// transports, "ucx-tcp" with UCX_TLS=tcp), and, as references, (c) over a
// plain TCP loopback socket and (d) by memcpy (in this process), and (e) by
// UCX's own ucx_perftest (two processes; tag_bw, ucp_put_bw and
// ucp_get at the pushes' chunk size, default transports and tcp) — the same
// bytes, in the same run. The paths run in turn, round after round (this
// machine's bandwidth drifts between runs, so each ratio is taken within a
// round; medians over the rounds). Pushes are chunked, sealed (XXH3) and
// verified exactly as in the service, by one sending thread; each timed
// push follows --kv_bench_warmup untimed ones (ucx_perftest warms up too).
// Each row also shows the CPU time a push cost (both processes), which a
// busy machine does not inflate as it does the wall time, and each push
// where its time went on P (bench_kv_push.h: sealing its chunks, posting
// them, committing).
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/kv/kv_cache.h"
#include "common/model/model_source.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_wire.h"
#include "common/transport/ucx_kv_receiver.h"
#include "common/transport/ucx_kv_sender.h"
#include "common/transport/ucx_worker.h"
#include "common/util/checksum.h"
#include "common/util/malloc_tuning.h"
#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/common_flags.h"
#include "tools/service_cmds/bench_kv_push.h"
#include "tools/service_cmds/bench_kv_receiver.h"
#include "tools/service_cmds/bench_kv_refs.h"
#include "tools/subcommand.h"

ABSL_FLAG(std::string, kv_bench_model, "synthetic:llama-110m",
          "bench-kv-transfer: model whose KV shape sizes the transfer (a "
          "directory or synthetic:NAME; KV dtype from --kv_dtype/--dtype)");
ABSL_FLAG(int32_t, kv_bench_tokens, 2048,
          "bench-kv-transfer: prompt tokens whose KV is moved");
ABSL_FLAG(int32_t, kv_bench_repeats, 5,
          "bench-kv-transfer: rounds (every path runs once per round)");
ABSL_FLAG(int32_t, kv_bench_warmup, 1,
          "bench-kv-transfer: untimed pushes right before each timed push "
          "(grpc, ucx, ucx-tcp), as ucx_perftest warms up before it times: "
          "1 measures a push with its registered buffers and endpoints warm, "
          "as under steady traffic; 0 measures what a push after a pause "
          "pays (P unregisters pooled buffers idle for 10 s, and in a round "
          "with ucx_perftest the pause is longer)");
namespace {
// Every path bench-kv-transfer knows (and measures by default).
const std::vector<std::string>& AllKvBenchPaths() {
  static const auto* const paths = new std::vector<std::string>(
      {"memcpy", "tcp", "passes", "grpc", "ucx", "ucx-tcp", "ucx_perftest",
       "ucx_perftest-tcp"});
  return *paths;
}
}  // namespace

ABSL_FLAG(std::vector<std::string>, kv_bench_paths, AllKvBenchPaths(),
          "bench-kv-transfer: what to measure (memcpy always runs: the ratios "
          "need it). passes: a push's passes over the bytes alone (KV pool "
          "export and import, XXH3); ucx_perftest[-tcp] runs tag_bw, "
          "ucp_put_bw and ucp_get.");

namespace pdserve {
namespace {

namespace pb = ::pdserve::v1::internal;

void Progress(const std::string& text) {
  std::fprintf(stderr, "\r\033[Kbench-kv-transfer: %s", text.c_str());
  std::fflush(stderr);
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "\nbench-kv-transfer: %s\n", message.c_str());
  return 1;
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

// P's side of a UCX push: a worker started with UCX_TLS=`tls` ("" = as in
// the environment) and a sender on it, gRPC as the control stream.
struct UcxSender {
  std::unique_ptr<transport::UcxWorker> worker;
  std::unique_ptr<transport::UcxKvSender> sender;
  ~UcxSender() { sender.reset(); }  // regions before their worker
};

absl::StatusOr<std::unique_ptr<UcxSender>> StartUcxSender(
    const std::string& tls, transport::GrpcKvSender* grpc) {
  const char* old = getenv("UCX_TLS");
  const std::string saved = old != nullptr ? old : "";
  if (!tls.empty()) setenv("UCX_TLS", tls.c_str(), 1);
  auto w = transport::UcxWorker::Create();
  if (old != nullptr) {
    setenv("UCX_TLS", saved.c_str(), 1);
  } else {
    unsetenv("UCX_TLS");
  }
  if (!w.ok()) return w.status();
  auto s = std::make_unique<UcxSender>();
  s->worker = *std::move(w);
  s->sender =
      std::make_unique<transport::UcxKvSender>(grpc, s->worker.get(), nullptr);
  return s;
}

// One measured path: `run` returns GB/s (it times itself).
// One measurement: bandwidth, and the CPU time this process spent on it
// (both ends of a push run here; a busy machine stretches the wall time,
// not the work). cpu_seconds < 0: not measured (another process moved it).
struct Sample {
  Sample(double g, double cpu, std::optional<KvPushPhases> p = std::nullopt)
      : gbps(g), cpu_seconds(cpu), phases(p) {}
  double gbps = 0;
  double cpu_seconds = -1;
  std::optional<KvPushPhases> phases;  // pushes: P's side of the push
};

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

struct Path {
  Path(std::string n, std::string ref,
       std::function<absl::StatusOr<Sample>()> f)
      : name(std::move(n)), reference(std::move(ref)), run(std::move(f)) {}
  std::string name;
  std::string reference;  // the row its "vs reference" ratio divides by
  std::function<absl::StatusOr<Sample>()> run;
  std::vector<double> gbps;          // per round
  std::vector<double> ratio;         // per round, to memcpy of the same round
  std::vector<double> cpu;           // per round: CPU seconds per GB moved
  std::vector<KvPushPhases> phases;  // per round (pushes)
};

int RunBenchKvTransfer(const std::vector<std::string>&) {
  TuneMallocForLargeBuffers();  // as the prefill and decode workers do
  auto layout = BenchLayout();
  if (!layout.ok()) return Fail(layout.status().ToString());
  const int tokens = absl::GetFlag(FLAGS_kv_bench_tokens);
  const int rounds = absl::GetFlag(FLAGS_kv_bench_repeats);
  if (rounds <= 0) return Fail("--kv_bench_repeats must be positive");
  if (tokens <= 0) return Fail("--kv_bench_tokens must be positive");
  const std::vector<std::string>& known_paths = AllKvBenchPaths();
  for (const std::string& p : absl::GetFlag(FLAGS_kv_bench_paths)) {
    if (std::find(known_paths.begin(), known_paths.end(), p) ==
        known_paths.end()) {
      return Fail(absl::StrCat("--kv_bench_paths: unknown path '", p,
                               "' (known: ", absl::StrJoin(known_paths, ","),
                               ")"));
    }
  }
  const int warmup = absl::GetFlag(FLAGS_kv_bench_warmup);
  if (warmup < 0) return Fail("--kv_bench_warmup must be 0 or more");
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
  // The receiver runs in its own process, as a decode worker does (forked
  // now, before this process has a thread).
  auto rx = StartKvBenchReceiver(*layout, tokens, src, wanted("ucx"),
                                 wanted("ucx-tcp"));
  if (!rx.ok()) return Fail(rx.status().ToString());
  struct StopAtExit {
    KvBenchReceiver* r;
    ~StopAtExit() { StopKvBenchReceiver(*r); }
  } stop_rx{&*rx};
  transport::GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  std::map<std::string, std::unique_ptr<UcxSender>> ucx;
  for (const auto& [name, tls] :
       {std::pair<std::string, std::string>{"ucx", ""}, {"ucx-tcp", "tcp"}}) {
    if (!wanted(name)) continue;
    auto sender = StartUcxSender(tls, &grpc);
    if (!sender.ok()) {
      return Fail(absl::StrCat(name, ": ", sender.status().ToString()));
    }
    ucx[name] = *std::move(sender);
  }

  // Local paths (memcpy, TCP) time themselves and check the bytes.
  auto timed = [&](std::function<absl::Status()> once) {
    return [&, once]() -> absl::StatusOr<Sample> {
      std::fill(dst.begin(), dst.end(), '\0');
      const double c0 = ProcessCpuSeconds();
      const double t0 = MonotonicSeconds();
      if (absl::Status s = once(); !s.ok()) return s;
      const double dt = MonotonicSeconds() - t0;
      const double cpu = ProcessCpuSeconds() - c0;
      if (dst != src) return absl::DataLossError("bytes differ");
      return Sample{bytes / dt / 1e9, cpu};
    };
  };
  // Pushes: to the receiver process; CPU of both processes. Every chunk is
  // checked against P's XXH3 by the receiving service; the receiver's copy
  // is compared with the source after the last round.
  auto pushed = [&, warmup](std::function<absl::Status(KvPushPhases*)> once) {
    return [&, once, warmup]() -> absl::StatusOr<Sample> {
      for (int i = 0; i < warmup; ++i) {
        if (absl::Status s = once(nullptr); !s.ok()) return s;
      }
      KvPushPhases phases;
      const double c0 = ProcessCpuSeconds() + CpuSecondsOf(rx->pid);
      const double t0 = MonotonicSeconds();
      if (absl::Status s = once(&phases); !s.ok()) return s;
      const double dt = MonotonicSeconds() - t0;
      const double cpu = ProcessCpuSeconds() + CpuSecondsOf(rx->pid) - c0;
      return Sample{bytes / dt / 1e9, cpu, phases};
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
  // The passes over the bytes a push makes besides moving them, each alone
  // in this process: P exports each chunk from its KV pool to the wire
  // layout (the K tiles transposed back to rows) and seals it (XXH3); D
  // verifies each chunk (XXH3 again) and imports it into its pool.
  std::unique_ptr<KvCache> pool;
  SeqId pool_seq = 0;
  if (wanted("passes")) {
    auto made = KvCache::Create(
        *layout, layout->BytesPerBlock() *
                     ((tokens + layout->block_size - 1) / layout->block_size));
    if (!made.ok()) return Fail(made.status().ToString());
    pool = *std::move(made);
    pool_seq = pool->CreateSequence();
    if (absl::Status s = pool->Reserve(pool_seq, tokens); !s.ok()) {
      return Fail(s.ToString());
    }
    if (absl::Status s = pool->SetLength(pool_seq, tokens); !s.ok()) {
      return Fail(s.ToString());
    }
  }
  // Chunk by chunk, as the prefill exports and D imports: chunk [b, e) of
  // layer l is src's bytes at (l * tokens + b) * bpt, as PushOnce sends it.
  auto chunk_of = [&](const std::string& s, int layer, int b, int e) {
    return absl::string_view(s.data() + (int64_t{layer} * tokens + b) * bpt,
                             static_cast<size_t>((e - b) * bpt));
  };
  if (pool != nullptr) {
    // `hash`: XXH3 on the way, as the decode worker imports (the sum of
    // the checksums must then match what P sealed).
    // The checksums P sealed, computed before any timing.
    auto sealed = std::make_shared<std::vector<uint64_t>>();
    for (int l = 0; l < layout->num_layers; ++l) {
      for (auto [b, e] : ranges) {
        sealed->push_back(transport::KvChecksum(chunk_of(src, l, b, e)));
      }
    }
    auto import_all = [&, sealed](bool hash) -> absl::Status {
      size_t i = 0;
      for (int l = 0; l < layout->num_layers; ++l) {
        for (auto [b, e] : ranges) {
          uint64_t xxh3 = 0;
          absl::Status s =
              pool->ImportLayer(pool_seq, l, b, e, chunk_of(src, l, b, e),
                                hash ? &xxh3 : nullptr);
          if (!s.ok()) return s;
          if (hash && xxh3 != (*sealed)[i]) {
            return absl::DataLossError("import checksum differs");
          }
          ++i;
        }
      }
      return absl::OkStatus();
    };
    if (absl::Status s = import_all(true); !s.ok()) return Fail(s.ToString());
    for (bool hash : {false, true}) {
      paths.emplace_back(
          hash ? "kv import+xxh3 (pass)" : "kv import (pass)", "",
          [&, import_all, hash]() -> absl::StatusOr<Sample> {
            const double c0 = ProcessCpuSeconds();
            const double t0 = MonotonicSeconds();
            if (absl::Status s = import_all(hash); !s.ok()) return s;
            const double dt = MonotonicSeconds() - t0;
            return Sample{bytes / dt / 1e9, ProcessCpuSeconds() - c0};
          });
    }
    // Into per-chunk buffers allocated (and faulted in) before the timing;
    // the bytes (what the imports left in the pool) are checked after it.
    auto exported = std::make_shared<std::vector<std::string>>();
    for (int l = 0; l < layout->num_layers; ++l) {
      for (auto [b, e] : ranges) exported->emplace_back((e - b) * bpt, '\0');
    }
    // `hash`: sealed on the way, as the prefill worker exports.
    for (bool hash : {false, true}) {
      paths.emplace_back(
          hash ? "kv export+xxh3 (pass)" : "kv export (pass)", "",
          [&, exported, hash]() -> absl::StatusOr<Sample> {
            std::vector<uint64_t> sums(exported->size());
            const double c0 = ProcessCpuSeconds();
            const double t0 = MonotonicSeconds();
            size_t i = 0;
            for (int l = 0; l < layout->num_layers; ++l) {
              for (auto [b, e] : ranges) {
                absl::Status s =
                    pool->ExportLayer(pool_seq, l, b, e, &(*exported)[i],
                                      hash ? &sums[i] : nullptr);
                ++i;
                if (!s.ok()) return s;
              }
            }
            const double dt = MonotonicSeconds() - t0;
            const double cpu = ProcessCpuSeconds() - c0;
            i = 0;
            for (int l = 0; l < layout->num_layers; ++l) {
              for (auto [b, e] : ranges) {
                const absl::string_view want = chunk_of(src, l, b, e);
                if ((*exported)[i] != want ||
                    (hash && sums[i] != transport::KvChecksum(want))) {
                  return absl::DataLossError("exported bytes differ");
                }
                ++i;
              }
            }
            return Sample{bytes / dt / 1e9, cpu};
          });
    }
    paths.emplace_back("xxh3 (pass)", "", [&]() -> absl::StatusOr<Sample> {
      const double c0 = ProcessCpuSeconds();
      const double t0 = MonotonicSeconds();
      uint64_t sum = 0;
      for (int64_t at = 0; at < bytes; at += chunk_bytes) {
        sum += transport::KvChecksum(absl::string_view(
            src.data() + at,
            static_cast<size_t>(std::min(chunk_bytes, bytes - at))));
      }
      const double dt = MonotonicSeconds() - t0;
      if (sum == 0) return absl::InternalError("checksums sum to 0");
      return Sample{bytes / dt / 1e9, ProcessCpuSeconds() - c0};
    });
  }
  if (wanted("grpc")) {
    paths.emplace_back("grpc", "", pushed([&](KvPushPhases* phases) {
                         return PushKvOnce(grpc, rx->target, *layout, tokens,
                                           src, "grpc", phases);
                       }));
  }
  for (const auto& [name, tls] :
       {std::pair<std::string, std::string>{"ucx", ""}, {"ucx-tcp", "tcp"}}) {
    if (ucx.count(name) == 0) continue;
    transport::UcxKvSender* sender = ucx[name]->sender.get();
    const std::string target =
        tls.empty() ? rx->ucx_target : rx->ucx_tcp_target;
    const std::string ref =
        tls.empty() ? "ucx_perftest tag_bw" : "ucx_perftest tag_bw tcp";
    paths.emplace_back(name, ref,
                       pushed([&, sender, target](KvPushPhases* phases) {
                         return PushKvOnce(*sender, target, *layout, tokens,
                                           src, "ucx", phases);
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
          [test, tls = tls, chunk_bytes, chunks]() -> absl::StatusOr<Sample> {
            auto g = UcxPerftestGbps(test, chunk_bytes,
                                     std::max(40, 4 * chunks), tls);
            if (!g.ok()) return g.status();
            return Sample{*g, -1};
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
      if (p.name == "memcpy") memcpy_gbps = g->gbps;
      p.gbps.push_back(g->gbps);
      p.ratio.push_back(g->gbps / memcpy_gbps);
      if (g->cpu_seconds >= 0) p.cpu.push_back(g->cpu_seconds / (bytes / 1e9));
      if (g->phases) p.phases.push_back(*g->phases);
    }
  }
  absl::Status verified = absl::OkStatus();
  for (const char* push : {"grpc", "ucx", "ucx-tcp"}) {
    if (wanted(push)) verified = VerifyKvBenchReceiver(*rx);
    if (wanted(push)) break;
  }
  ucx.clear();
  std::fprintf(stderr, "\r\033[K");
  if (!verified.ok()) return Fail(verified.ToString());

  // Ratio of a path to its reference row, per round, median; nullopt when
  // the reference did not run (not in --kv_bench_paths, or it failed).
  auto vs_reference = [&](const Path& p) -> std::optional<double> {
    for (const Path& r : paths) {
      if (r.name != p.reference || r.gbps.size() != p.gbps.size()) continue;
      std::vector<double> q;
      for (size_t i = 0; i < p.gbps.size(); ++i)
        q.push_back(p.gbps[i] / r.gbps[i]);
      return Median(q);
    }
    return std::nullopt;
  };
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json j;
    j["model"] = absl::GetFlag(FLAGS_kv_bench_model);
    j["tokens"] = tokens;
    j["bytes"] = bytes;
    j["chunk_bytes"] = chunk_bytes;
    j["rounds"] = rounds;
    j["warmup_pushes"] = warmup;
    for (const Path& p : paths) {
      j["results"][p.name] = {
          {"median_gbps", Median(p.gbps)},
          {"best_gbps", *std::max_element(p.gbps.begin(), p.gbps.end())},
          {"ratio_to_memcpy", Median(p.ratio)},
          {"gbps", p.gbps}};
      if (!p.cpu.empty()) {
        j["results"][p.name]["cpu_seconds_per_gb"] = Median(p.cpu);
      }
      if (!p.phases.empty()) {
        j["results"][p.name]["push_phases_ms"] = KvPushPhasesJson(p.phases);
      }
      if (!p.reference.empty()) {
        j["results"][p.name]["reference"] = p.reference;
        if (const auto ratio = vs_reference(p)) {
          j["results"][p.name]["ratio_to_reference"] = *ratio;
        }
      }
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "KV of %s, %d tokens: %d layers x 2 x %d kv heads x %d dims x "
      "%d bytes = %.1f MB in %d chunks of <= %.2f MB; %d rounds, paths "
      "alternating; %d untimed push(es) before each timed one; medians\n",
      absl::GetFlag(FLAGS_kv_bench_model).c_str(), tokens, layout->num_layers,
      layout->num_kv_heads, layout->head_dim, DTypeSize(layout->dtype),
      bytes / 1e6, chunks, chunk_bytes / 1e6, rounds, warmup);
  std::printf("%-26s %8s %8s %10s %9s  %s\n", "path", "GB/s", "best",
              "vs memcpy", "CPU s/GB", "vs reference");
  for (const Path& p : paths) {
    std::string ref;
    if (!p.reference.empty()) {
      const auto ratio = vs_reference(p);
      ref = ratio ? absl::StrFormat("%.3fx %s", *ratio, p.reference)
                  : absl::StrCat(p.reference, " not run");
    }
    const std::string cpu =
        p.cpu.empty() ? "-" : absl::StrFormat("%.3f", Median(p.cpu));
    std::printf("%-26s %8.2f %8.2f %9.3fx %9s  %s\n", p.name.c_str(),
                Median(p.gbps), *std::max_element(p.gbps.begin(), p.gbps.end()),
                Median(p.ratio), cpu.c_str(), ref.c_str());
  }
  std::printf(
      "(CPU s/GB: this process's CPU time, both ends of a push, per GB "
      "moved)\n");
  bool any_push = false;
  for (const Path& p : paths) {
    if (p.phases.empty()) continue;
    PrintKvPushPhases(p.name, p.phases, bytes);
    any_push = true;
  }
  if (any_push) {
    std::printf(
        "(seal: P copies and seals its chunks, as its export does; post: P "
        "announces them and waits when ahead of D; commit: D's last "
        "imports)\n");
  }
  return 0;
}

PDSERVE_SUBCOMMAND(
    "bench-kv-transfer",
    "loopback KV transfer bandwidth: gRPC and UCX pushes, TCP, memcpy, "
    "ucx_perftest",
    "pdserve bench-kv-transfer [--kv_bench_model=synthetic:llama-110m] "
    "[--kv_bench_tokens=2048] [--kv_bench_repeats=5] [--kv_bench_warmup=1] "
    "[--kv_bench_paths=memcpy,ucx,...] [--json]",
    FlagNames({{"dtype", "kv_dtype", "block_size", "json"}}),
    RunBenchKvTransfer);

}  // namespace
}  // namespace pdserve
