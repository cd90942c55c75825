// The KV transport interface: how a prefill worker pushes one sequence's KV
// to a decode worker (KvSender / KvPushStream) and how a decode worker
// consumes pushes (KvSink). gRPC client-streaming is one implementation
// (grpc_kv_transport.h); UCX (ucx_kv_sender.h, ucx_kv_receiver.h)
// implements the same interfaces, with gRPC as its control stream. KvSender
// implementations are thread-safe; a KvPushStream is driven by one thread,
// except Cancel(), which any thread may call.
#ifndef PDSERVE_COMMON_TRANSPORT_KV_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_KV_TRANSPORT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/kv_wire.h"
#include "common/util/adaptive_stores.h"
#include "common/util/streaming_copy.h"

namespace pdserve::transport {

struct KvPushResult {
  int64_t bytes = 0;               // KV payload bytes acknowledged by D
  double transfer_seconds = 0;     // measured by D
  std::string transport = "grpc";  // "grpc" | "ucx": how the bytes went
};

// The memory one outgoing chunk's bytes are written into before it is
// sent (KvSender::NewChunkBuffer): memory the transport registered and
// sends in place (UCX), or a string that becomes the chunk's data without a
// copy. Thread-compatible; passed from the exporting thread to the push.
class KvChunkBuffer {
 public:
  virtual ~KvChunkBuffer() = default;
  virtual char* data() = 0;
  virtual int64_t size() const = 0;
  // The bytes as a string: moved out when they are one, else copied.
  virtual std::string TakeBytes() = 0;

  // Writes the buffer: calls `fill` with how to store the bytes, which is
  // ordinary stores unless the buffer's reader is another process reading
  // it in place (store_chooser()), whose chooser gets the fill's timing.
  absl::Status Fill(const std::function<absl::Status(Stores)>& fill) {
    AdaptiveStores* chooser = store_chooser();
    if (chooser == nullptr) return fill(Stores::kCached);
    const Stores stores = chooser->Choose();
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = fill(stores);
    if (s.ok()) {
      chooser->Report(stores, size(),
                      std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    }
    return s;
  }

 protected:
  // How a fill should store for this buffer's reader (AdaptiveStores);
  // null: ordinary stores.
  virtual AdaptiveStores* store_chooser() { return nullptr; }
};

// A KvChunkBuffer that is a string.
class StringChunkBuffer : public KvChunkBuffer {
 public:
  explicit StringChunkBuffer(int64_t bytes)
      : bytes_(static_cast<size_t>(bytes), '\0') {}
  char* data() override { return bytes_.data(); }
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }
  std::string TakeBytes() override { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// One sequence's push. Send chunks in per-layer token order, then Commit.
class KvPushStream {
 public:
  virtual ~KvPushStream() = default;
  // Takes the chunk (sealed by the caller with SealChunk). A failed stream
  // keeps failing with the first error.
  virtual absl::Status Send(pb::KvChunk chunk) = 0;
  // Send for a chunk whose bytes are in `bytes` (from the sender's
  // NewChunkBuffer; `chunk` carries the rest, its checksum included). A
  // transport that registered the buffer sends it in place; the default
  // makes it the chunk's data.
  virtual absl::Status SendBuffer(pb::KvChunk chunk,
                                  std::unique_ptr<KvChunkBuffer> bytes) {
    chunk.set_data(bytes->TakeBytes());
    return Send(std::move(chunk));
  }
  // Sends the commit and waits for D's acknowledgement.
  virtual absl::StatusOr<KvPushResult> Commit(const pb::KvCommit& commit) = 0;
  // Aborts the push (D frees what it reserved). Thread-safe, idempotent.
  virtual void Cancel() = 0;
};

// Test-only fault injection for the sender (flags named --testonly_*).
struct KvFaultInjection {
  int corrupt_chunk = -1;  // flip a byte of this chunk (0-based), after sealing
  int stop_after_chunks =
      -1;  // send this many chunks, then stall until cancelled
};

class KvSender {
 public:
  virtual ~KvSender() = default;
  // Opens a push to `target` (host:port) and sends the header. The stream
  // fails with the receiver's status (e.g. FAILED_PRECONDITION,
  // RESOURCE_EXHAUSTED) on a later Send/Commit when it refuses. `deadline`
  // bounds the whole push.
  virtual absl::StatusOr<std::unique_ptr<KvPushStream>> Open(
      const std::string& target, const pb::KvHeader& header,
      absl::Time deadline) = 0;
  // Memory for a chunk of `bytes` to be pushed to `target` (export into it,
  // then SendBuffer): what this transport sends from without a copy.
  virtual std::unique_ptr<KvChunkBuffer> NewChunkBuffer(
      const std::string& target, int64_t bytes) {
    return std::make_unique<StringChunkBuffer>(bytes);
  }
};

// The receiving end of one push, implemented by the decode worker. Methods
// are called by one thread in order: (OnChunk)* then OnCommit; OnAbort may
// end it at any point (the stream broke, a chunk failed verification).
class KvSink {
 public:
  virtual ~KvSink() = default;
  // Chunks have passed KvCoverage::Accept: order, size and (when `xxh3` is
  // null) checksum. The bytes are valid during the call only (they may be
  // in shared memory). A sink whose HashesChunks() is true gets `xxh3` and
  // sets it to KvChecksum(chunk.data), hashed while it reads the bytes
  // anyway (the import): the caller then fails the push with DATA_LOSS on a
  // mismatch, after the call, so such a sink must keep a chunk's bytes
  // where only a committed push makes them count (OnAbort discards them).
  virtual absl::Status OnChunk(const KvChunkView& chunk, uint64_t* xxh3) = 0;
  // Whether OnChunk hashes the bytes (saves the caller a pass over them).
  virtual bool HashesChunks() const { return false; }
  // Every chunk arrived; `transfer_seconds` from the header to now.
  virtual absl::Status OnCommit(const pb::KvCommit& commit,
                                double transfer_seconds) = 0;
  virtual void OnAbort(const absl::Status& status) = 0;
  // A chunk failed its checksum (OnAbort with DATA_LOSS follows).
  virtual void OnChecksumFailure() {}
};

// D: where the bytes of a push's chunk references (pb::KvChunkRef) are: UCX
// messages from P, received into a landing buffer. Driven by the push's
// handler thread.
class KvChunkSource {
 public:
  virtual ~KvChunkSource() = default;
  // The chunk `ref` names; its bytes are valid until Consumed, the next
  // Fetch or the source's destruction. INVALID_ARGUMENT for a malformed
  // reference; `cancelled` (the push stream broke or was cancelled) may end
  // a slow fetch (CANCELLED).
  virtual absl::StatusOr<KvChunkView> Fetch(
      const pb::KvChunkRef& ref, const std::function<bool()>& cancelled) = 0;
  // The last fetched chunk's bytes are no longer read (the sink returned):
  // a source reading P's memory in place tells P at once, rather than when
  // the next chunk's reference arrives one control-stream message later.
  virtual void Consumed() {}
  // The push failed with `status` (P may be gone): drop what connects this
  // process to P once no other push uses it.
  virtual void Failed(const absl::Status& status) {}
};

class KvSinkFactory {
 public:
  virtual ~KvSinkFactory() = default;
  // Called for each header after CheckHeaderCompatible passed. `cancel`
  // breaks the push stream from the receiving side (e.g. lease expiry) and
  // stays valid until the sink is destroyed. Errors (RESOURCE_EXHAUSTED when
  // no room) refuse the push.
  virtual absl::StatusOr<std::unique_ptr<KvSink>> Begin(
      const pb::KvHeader& header, std::function<void()> cancel) = 0;
  // A header failed CheckHeaderCompatible (e.g. FAILED_PRECONDITION for
  // another model): remembered so that the router's claim learns why.
  virtual void Refused(const pb::KvHeader& header, const absl::Status& status) {
  }
  virtual const std::string& fingerprint() const = 0;
  virtual KvLayout layout() const = 0;
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_KV_TRANSPORT_H_
