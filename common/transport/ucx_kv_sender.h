// The prefill worker's side of the UCX KV transport. The prefill exports
// each sealed chunk into a chunk buffer from NewChunkBuffer: pooled memory
// registered with UCX once (allocated by UCX as shared memory when in-place
// pushes are on). A push announces each chunk on the KvTransfer.Push call
// (KvChunkRef: layer, tokens, length, XXH3, tag) and then either leaves it
// in place, for a decode worker on this host whose Describe answered the
// probe of this worker's shared memory (the reference carries the buffer's
// remote key and ack word; D maps it, imports from it and acknowledges), or
// sends it from the buffer as a tagged UCX message to D's UCX worker
// (address from its Describe; one endpoint per decode worker, cached),
// which receives it into a landing buffer (ucx_kv_receiver.h). Chunks
// handed over as strings are copied into a ring of kSlots registered slots
// first. At most kSlots sends (or unacknowledged chunks in place) are in
// flight; a buffer returns to the pool once its send completed or D
// acknowledged it, all of them after D's commit acknowledgement. A buffer
// left in place is filled (KvChunkBuffer::Fill) with ordinary or
// non-temporal stores, whichever in_place_stores() measures hands chunks
// to D faster now (adaptive_stores.h). Tagged
// rendezvous is what UCX 1.13 moves with one CMA copy over shared memory
// and RDMA reads between hosts (its one-sided get and put over shared
// memory go through active-message copies: see DESIGN.md). A failed
// push's memory returns after its sends ended (D discards what it no
// longer wants; if they do not end, the decode worker is presumed gone and
// the endpoint is closed) and a quarantine. UcxKvSender picks UCX per
// decode worker (its Describe names a UCX worker this worker can reach);
// otherwise the push goes to `fallback` (auto mode) or fails
// (--kv_transport=ucx). Thread-safe; streams follow KvPushStream's rules.
#ifndef PDSERVE_COMMON_TRANSPORT_UCX_KV_SENDER_H_
#define PDSERVE_COMMON_TRANSPORT_UCX_KV_SENDER_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_transport.h"
#include "common/transport/ucx_worker.h"
#include "common/util/adaptive_stores.h"

namespace pdserve::transport {

class UcxKvSender : public KvSender {
 public:
  // Registered memory kept pooled (rings and chunk buffers) at most.
  static constexpr int64_t kMaxPooledBytes = int64_t{128} << 20;
  // Of which kept registered however long unused (Options::warm_bytes): a
  // push of 4 MiB chunks, its ring and the chunk buffers in flight.
  static constexpr int64_t kWarmBytes = int64_t{64} << 20;
  // Chunk slots of a push's ring: the sends one push has in flight at most.
  static constexpr int kSlots = 8;
  struct Options {
    // Unused pooled regions are unregistered after this long, except the
    // most recently returned ones up to warm_bytes in all while pushes
    // succeed: the next push after a pause then finds its memory
    // registered and mapped (a push into fresh UCX memory runs at 0.6x a
    // warm one: docs/performance.md, "Warm pushes"). Once a region comes
    // back from a failed push (its decode worker may be gone), none stays
    // warm until a push succeeds again, so a prefill worker whose peers
    // died returns to zero registered bytes.
    absl::Duration pool_idle = absl::Seconds(10);
    int64_t warm_bytes = kWarmBytes;
    // A failed or cancelled push's region is not reused before this long.
    absl::Duration quarantine = absl::Seconds(2);
    // Leave chunks in place for decode workers on this host that can map
    // this worker's shared memory (Describe's probe). Default: on unless
    // PDSERVE_UCX_IN_PLACE=0.
    bool in_place = InPlaceDefault();
    // Chunks a push leaves in place unacknowledged before it waits for D:
    // 2, so P runs one chunk ahead of D's import and the chunk D reads next
    // is the one P just wrote, still in the shared L3 (measured: 1.2-1.3x a
    // 268 MB push's bandwidth with 8, docs/performance.md "KV transfer").
    // At least 2: D acknowledges a chunk once its import returned, so with
    // 1 P would seal no chunk while D imports the last.
    // A D that acknowledges nothing for 20 ms gets up to kSlots (the push
    // stream, MakeRoomInPlace). PDSERVE_UCX_IN_PLACE_UNACKED=N (2..kSlots)
    // sets it, for A/B runs.
    int in_place_unacked = InPlaceUnackedDefault();
  };
  static bool InPlaceDefault();
  static int InPlaceUnackedDefault();

  // `grpc` carries the control stream; `worker` registers and serves the
  // regions; `fallback` (may be null: UCX or fail) takes the pushes UCX
  // cannot carry. All must outlive this.
  UcxKvSender(GrpcKvSender* grpc, UcxWorker* worker, KvSender* fallback,
              Options options);
  UcxKvSender(GrpcKvSender* grpc, UcxWorker* worker, KvSender* fallback)
      : UcxKvSender(grpc, worker, fallback, Options()) {}
  ~UcxKvSender() override;  // unregisters the pooled regions
  absl::StatusOr<std::unique_ptr<KvPushStream>> Open(
      const std::string& target, const pb::KvHeader& header,
      absl::Time deadline) override;
  // A pooled registered region, which a UCX push sends in place; a string
  // for a target known not to take UCX pushes (or when registering fails).
  std::unique_ptr<KvChunkBuffer> NewChunkBuffer(const std::string& target,
                                                int64_t bytes) override;

  // Whether `target` accepts UCX pushes (Describe, cached per target;
  // errors: the Describe call failed).
  absl::StatusOr<bool> UcxUsable(const std::string& target,
                                 absl::Time deadline);
  // What `target`'s Describe said (cached; a negative answer for
  // kNegativeTtl).
  struct Peer {
    bool usable = false;
    std::string address;       // D's UCX worker
    bool peer_errors = false;  // UCX detects a dead D (not on one host)
    bool in_place = false;     // D maps this worker's shared memory
    absl::Time at;
  };
  absl::StatusOr<Peer> PeerOf(const std::string& target, absl::Time deadline);
  // Drops the cached answer for `target` (after a failed push).
  void Forget(const std::string& target);

  // A registered ring of at least `bytes`: the smallest reusable pooled
  // one not more than twice as large (or than kRegionRound), else a new one.
  // `shared`: memory UCX allocates, which a peer on this host can map
  // (AllocateShared), for chunk buffers left in place.
  absl::StatusOr<std::unique_ptr<UcxRegion>> TakeRegion(int64_t bytes,
                                                        bool shared);
  // Back to the pool; `clean`: D acknowledged the push (reusable at once).
  void ReturnRegion(std::unique_ptr<UcxRegion> region, bool clean);
  // Back to the pool from a failed push whose chunk in it P revoked (D
  // will not read it): reusable at once, but not unregistered before
  // kMapGrace, since a late D may still map it before refusing the chunk
  // (UCX 1.13 crashes unpacking the key of a segment already freed).
  void ReturnRevokedRegion(std::unique_ptr<UcxRegion> region);
  // Back to the pool from a failed push while D still reads a chunk in it:
  // reusable (and droppable) once `*ack_word` (in the region) holds `done`,
  // or after kReadBackstop (D presumed dead).
  void ReturnRegionWhileRead(std::unique_ptr<UcxRegion> region,
                             const uint64_t* ack_word, uint64_t done);
  static constexpr absl::Duration kMapGrace = absl::Seconds(30);
  static constexpr absl::Duration kReadBackstop = absl::Seconds(60);
  int pooled_regions();
  // Regions held by pushes in flight (rings) and by chunk buffers.
  int regions_in_use() const { return in_use_.load(); }
  // Pushes over UCX open now.
  int pushes_in_flight() const { return pushes_.load(); }

  GrpcKvSender* grpc() const { return grpc_; }
  // A UCX push stream began / ended (pushes_in_flight).
  void PushBegan() { pushes_.fetch_add(1); }
  void PushEnded() { pushes_.fetch_sub(1); }
  KvSender* fallback() const { return fallback_; }
  UcxWorker* worker() const { return worker_; }
  int in_place_unacked() const { return options_.in_place_unacked; }
  // How chunks left in place are written (UcxChunkBuffer::Fill): measured
  // across this worker's pushes.
  AdaptiveStores* in_place_stores() { return &in_place_stores_; }

  static constexpr int64_t kRegionRound = int64_t{2} << 20;

 private:
  static constexpr absl::Duration kNegativeTtl = absl::Seconds(60);
  struct Pooled {
    std::unique_ptr<UcxRegion> region;
    absl::Time since;       // returned
    absl::Time not_before;  // reusable from (or earlier, see read_word)
    absl::Time keep_until;  // not unregistered before (and not_before)
    // Set while D reads a chunk in the region: reusable (and droppable)
    // once the word holds read_done, or from not_before.
    const uint64_t* read_word = nullptr;
    uint64_t read_done = 0;
    bool Reusable(absl::Time now) const;
    bool Droppable(absl::Time now) const {
      return Reusable(now) && (now >= keep_until || read_word != nullptr);
    }
  };
  void ReapLoop();
  // Puts a returned region in the pool (dropping the oldest beyond
  // kMaxPooledBytes that nobody reads).
  void Pool(Pooled returned, bool clean);

  GrpcKvSender* const grpc_;
  UcxWorker* const worker_;
  KvSender* const fallback_;
  AdaptiveStores in_place_stores_;
  const Options options_;
  const bool in_place_;  // probe D; chunk buffers in shared memory
  std::atomic<int> in_use_{0};
  std::atomic<int> pushes_{0};
  absl::Mutex mu_;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<Pooled> pool_ ABSL_GUARDED_BY(mu_);  // in the order returned
  // The last region returned came back clean (Options::warm_bytes).
  bool keep_warm_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;  // unregisters regions idle for pool_idle
};

}  // namespace pdserve::transport

#endif  // PDSERVE_COMMON_TRANSPORT_UCX_KV_SENDER_H_
