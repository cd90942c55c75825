// attention_bench: thread CPU time of one decode step's attention (every
// layer and head of one sequence, llama-110m shapes: 12 layers x 12 heads x
// head_dim 64, blocks of 16) at several contexts, f32 and bf16 KV, on one
// thread, against a plain streaming read of as many bytes. The caches are
// flushed before each timed step (a decode step streams ~200 MB of weights
// between two attentions of a layer), so the KV comes from memory as in the
// engine. CPU time, not wall time, so that a shared machine's scheduling
// does not enter (stalls on memory still count).
//
//   build/tools/attention_bench [--hot] [contexts...]   (default 16 512 2048)
//
// --hot skips the flushes: with the KV in cache (a context's bf16 KV up to
// ~800 tokens fits this machine's 32 MiB L3) the ratio is the kernel's
// compute cost against a cached read, which tells compute from memory.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/backend/cpu/aligned_buffer.h"
#include "common/backend/cpu/attention.h"
#include "common/backend/cpu/bench_probes.h"
#include "common/backend/cpu/kernels.h"

namespace pdserve {
namespace {

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int Run(const std::vector<int>& contexts, bool hot) {
  constexpr int kLayers = 12, kHeads = 12, kHeadDim = 64, kBlock = 16;
  constexpr int kReps = 7;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> flush(int64_t{64} << 20);  // 256 MB
  for (auto& v : flush) v = u(rng);
  float sink = 0;
  std::printf("%-6s %8s %10s %12s %12s %10s\n", "kv", "context", "KV MB",
              "attention", "stream read", "ratio");
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int ctx : contexts) {
      KvLayout layout;
      layout.num_layers = kLayers;
      layout.num_kv_heads = kHeads;
      layout.head_dim = kHeadDim;
      layout.block_size = kBlock;
      layout.dtype = dtype;
      auto kv = std::move(*KvCache::Create(
          layout, layout.BytesPerBlock() * ((ctx + kBlock) / kBlock + 1)));
      const SeqId seq = kv->CreateSequence();
      if (!kv->Reserve(seq, ctx).ok()) return 1;
      const int kvd = kHeads * kHeadDim;
      std::vector<float> row(kvd);
      std::vector<char> stored(kv->row_bytes());
      for (int l = 0; l < kLayers; ++l) {
        for (int p = 0; p < ctx; ++p) {
          for (int which = 0; which < 2; ++which) {
            for (auto& v : row) v = u(rng);
            StoreRow(row.data(), kvd, dtype, stored.data());
            kv->WriteRow(seq, l, which, p, stored.data());
          }
        }
      }
      std::vector<float> q(kHeads * kHeadDim), out(kHeads * kHeadDim);
      for (auto& v : q) v = u(rng);
      const int64_t kv_bytes = kv->layout().BytesPerTokenPerLayer() * kLayers *
                               static_cast<int64_t>(ctx);
      // On huge pages, as the KV pool is (AllocateAligned).
      const int64_t stream_floats = kv_bytes / 4;
      AlignedBuffer stream_buffer = AllocateAligned(kv_bytes);
      float* const stream = reinterpret_cast<float*>(stream_buffer.get());
      for (int64_t i = 0; i < stream_floats; ++i) stream[i] = u(rng);
      double best = 1e30, best_stream = 1e30;
      for (int rep = 0; rep < kReps; ++rep) {
        if (!hot) sink += StreamingReadSum(flush.data(), flush.size());
        double t0 = ThreadCpuSeconds();
        for (int l = 0; l < kLayers; ++l) {
          for (int h = 0; h < kHeads; ++h) {
            const AttentionArgs args{
                kv.get(), kv->BlockTable(seq), l, h, kHeadDim, 0.125f};
            const AttentionQuery query{q.data() + h * kHeadDim, 0, ctx - 1,
                                       out.data() + h * kHeadDim};
            AttendHeads(args, &query, 1);
          }
        }
        best = std::min(best, ThreadCpuSeconds() - t0);
        sink += out[0];
        if (!hot) sink += StreamingReadSum(flush.data(), flush.size());
        if (hot) sink += StreamingReadSum(stream, stream_floats);
        t0 = ThreadCpuSeconds();
        sink += StreamingReadSum(stream, stream_floats);
        best_stream = std::min(best_stream, ThreadCpuSeconds() - t0);
      }
      std::printf("%-6s %8d %10.2f %9.3f ms %9.3f ms %10.2f\n",
                  DTypeName(dtype), ctx, kv_bytes / 1e6, 1e3 * best,
                  1e3 * best_stream, best / best_stream);
    }
  }
  return sink == 12345.0f ? 2 : 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  std::vector<int> contexts;
  bool hot = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--hot") {
      hot = true;
      continue;
    }
    const int ctx = std::atoi(argv[i]);
    if (ctx <= 0) {
      std::fprintf(stderr,
                   "attention_bench: '%s' is not a context length; usage: "
                   "attention_bench [--hot] [contexts...]\n",
                   argv[i]);
      return 2;
    }
    contexts.push_back(ctx);
  }
  if (contexts.empty()) contexts = {16, 512, 2048};
  return pdserve::Run(contexts, hot);
}
