// PrefillWorker's KV export: sealing each pass's layers into chunks for the
// pushes (ExportLayerChunks, from the engine's on_layer_done) and the pool
// gauge. Compute thread only, as the rest of the pass.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/transport/kv_wire.h"
#include "prefill_worker/prefill_worker.h"

namespace pdserve {

void PrefillWorker::ExportLayerChunks(int layer,
                                      absl::Span<const KvExportRange> ranges) {
  const auto start = absl::Now();
  const int64_t bytes_per_token = layout_.BytesPerTokenPerLayer();
  struct Chunk {
    const KvExportRange* range = nullptr;
    int begin = 0;
    int end = 0;
    // Into memory the push sends from (UCX: registered, no copy), sealed
    // on the way: the export hashes the bytes as it writes them.
    std::unique_ptr<transport::KvChunkBuffer> bytes;
    uint64_t xxh3 = 0;
    absl::Status status;
  };
  std::vector<Chunk> chunks;
  for (const KvExportRange& range : ranges) {
    for (auto [b, e] :
         transport::ChunkTokenRanges(range.begin, range.end, bytes_per_token,
                                     transport::kKvChunkTargetBytes)) {
      Chunk& c = chunks.emplace_back();
      c.range = &range;
      c.begin = b;
      c.end = e;
    }
  }
  std::vector<PushPipeline*> failed;
  auto has_failed = [&](PushPipeline* push) {
    return std::find(failed.begin(), failed.end(), push) != failed.end();
  };
  // A group at a time, so that a long reused prefix does not hold all its
  // chunk buffers at once before the push takes any.
  for (size_t first = 0; first < chunks.size(); first += kExportGroupChunks) {
    const size_t last = std::min(chunks.size(), first + kExportGroupChunks);
    for (size_t i = first; i < last; ++i) {
      Chunk& c = chunks[i];
      if (has_failed(c.range->push)) continue;
      c.bytes =
          c.range->push->NewChunkBuffer(bytes_per_token * (c.end - c.begin));
    }
    auto fill = [&](int k) {
      Chunk& c = chunks[first + k];
      if (c.bytes == nullptr) return;
      c.status = c.bytes->Fill([&](Stores stores) {
        return engine_->ExportLayerKv(
            c.range->seq, layer, c.begin, c.end,
            absl::MakeSpan(c.bytes->data(), c.bytes->size()), &c.xxh3, stores);
      });
    };
    const int n = static_cast<int>(last - first);
    if (parallel_export_ && n > 1) {
      engine_->ForEachParallel(n, fill);
    } else {
      for (int k = 0; k < n; ++k) fill(k);
    }
    for (size_t i = first; i < last; ++i) {
      Chunk& c = chunks[i];
      PushPipeline* push = c.range->push;
      if (c.bytes == nullptr || has_failed(push)) continue;
      if (!c.status.ok()) {
        push->Cancel();
        failed.push_back(push);
        continue;
      }
      pb::KvChunk chunk;
      chunk.set_layer(layer);
      chunk.set_token_begin(c.begin);
      chunk.set_token_end(c.end);
      chunk.set_xxh3(c.xxh3);
      push->Enqueue(std::move(chunk), std::move(c.bytes));
    }
  }
  pass_export_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
}

void PrefillWorker::ExportKvPool() {
  const int64_t total = engine_->total_blocks();
  options_.metrics->kv_pool().Set(total - engine_->free_blocks(), total);
}

}  // namespace pdserve
