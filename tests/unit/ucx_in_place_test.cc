// Tests of chunks a prefill worker leaves in place for a decode worker on
// the same host (UCX shared memory): D acknowledges each as it imports it,
// and the ack word's claim and revocation keep P from rewriting, or
// unmapping, a buffer D still reads or may still map after P gave up on
// its push. Part of ucx_transport_test.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/ucx_in_place_ack.h"
#include "common/transport/ucx_kv_push_stream.h"
#include "common/transport/ucx_kv_receiver.h"
#include "common/transport/ucx_kv_sender.h"
#include "common/transport/ucx_worker.h"
#include "gtest/gtest.h"
#include "tests/unit/transport_test_util.h"
#include "tests/unit/ucx_push_fixture.h"
#include "tests/unit/ucx_test_util.h"

namespace pdserve::transport {
namespace {

// Pushes whose chunks D reads in place: shared memory only (over
// UCX_TLS=tcp chunks go as messages, nothing is read in place).
class UcxInPlaceAckTest : public UcxPushTest {
 protected:
  // Sends `c` in place on `stream`; returns its buffer's ack word (null:
  // not a buffer D can read in place) and sets `packed_rkey` (if given) to
  // its region's key.
  const uint64_t* SendInPlace(UcxKvSender& sender, KvPushStream& stream,
                              pb::KvChunk c,
                              std::string* packed_rkey = nullptr) {
    std::unique_ptr<KvChunkBuffer> bytes =
        sender.NewChunkBuffer(target_, static_cast<int64_t>(c.data().size()));
    auto* own = dynamic_cast<UcxChunkBuffer*>(bytes.get());
    if (own == nullptr) return nullptr;
    if (packed_rkey != nullptr) *packed_rkey = own->region().packed_rkey();
    const uint64_t* ack = own->ack_word();
    std::memcpy(bytes->data(), c.data().data(), c.data().size());
    c.clear_data();
    EXPECT_TRUE(stream.SendBuffer(std::move(c), std::move(bytes)).ok());
    return ack;
  }
  // Holds D inside the first chunk's import of push `id`, before it reads
  // the bytes, until ResumeD (or the test's end); reading_ is notified when
  // D is there.
  void StallFirstChunkOf(const std::string& id) {
    factory_.before_chunk_ = [this, id](const std::string& push) {
      if (push != id || reading_.HasBeenNotified()) return;
      reading_.Notify();
      resume_.WaitForNotification();
    };
  }
  void ResumeD() {
    if (!resume_.HasBeenNotified()) resume_.Notify();
  }
  void TearDown() override {
    ResumeD();
    UcxPushTest::TearDown();
  }
  absl::Notification reading_, resume_;

  // D released the chunk (the word holds a bare tag).
  static bool Released(const uint64_t* ack) {
    const uint64_t w = __atomic_load_n(ack, __ATOMIC_ACQUIRE);
    return in_place_ack::ValidTag(w);
  }
};

// D acknowledges a chunk it read in place as soon as its sink returned,
// not when the next chunk's reference arrives: P's flow control waits on
// D's import, not on one more control-stream message.
TEST_P(UcxInPlaceAckTest, ChunkReadInPlaceIsAcknowledgedOnceTheSinkReturns) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  auto sender = Sender(&grpc, nullptr);
  const std::string id = "acked-early";
  auto stream = sender->Open(target_, Header(id, 10, "model-a"),
                             absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stream.ok()) << stream.status();
  const KvLayout l = TestLayout();
  std::vector<pb::KvChunk> sent;
  for (int layer = 0; layer < l.num_layers; ++layer) {
    sent.push_back(MakeChunk(l, layer, 0, 10, layer + 1));
  }
  const uint64_t* first_ack = SendInPlace(*sender, **stream, sent[0]);
  ASSERT_NE(first_ack, nullptr);
  // Only the first chunk is out: D's sink takes it, then its ack word holds
  // the chunk's tag while no further reference has been sent.
  bool acked = false;
  for (int wait = 0; wait < 1000 && !acked; ++wait) {
    acked = factory_.Get(id).chunks.size() == 1 && Released(first_ack);
    if (!acked) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(acked) << "chunk 0 unacknowledged after its import";
  for (size_t i = 1; i < sent.size(); ++i) {
    ASSERT_NE(SendInPlace(*sender, **stream, sent[i]), nullptr);
  }
  pb::KvCommit commit;
  commit.mutable_first_token()->set_id(42);
  auto result = (*stream)->Commit(commit);
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectSame(id, sent);
  EXPECT_EQ(sender->regions_in_use(), 0);
}

// The ack word of a chunk in place: a claim (D) and a revocation (P) race,
// and exactly one wins; a word another chunk reused takes neither.
TEST(InPlaceAckTest, ClaimAndRevokeExcludeEachOther) {
  const uint64_t tag = (uint64_t{0x5a5a5a} << 24) | 7;
  ASSERT_TRUE(in_place_ack::ValidTag(tag));
  EXPECT_FALSE(in_place_ack::ValidTag(7));
  EXPECT_FALSE(in_place_ack::ValidTag(in_place_ack::kAnnouncedBit | tag));
  uint64_t word = 0;
  in_place_ack::Announce(&word, tag);
  EXPECT_FALSE(in_place_ack::Released(&word, tag));
  ASSERT_TRUE(in_place_ack::Claim(&word, tag));
  EXPECT_FALSE(in_place_ack::Revoke(&word, tag)) << "D is reading it";
  EXPECT_FALSE(in_place_ack::Claim(&word, tag));
  in_place_ack::Release(&word, tag);
  EXPECT_TRUE(in_place_ack::Released(&word, tag));
  EXPECT_TRUE(in_place_ack::Revoke(&word, tag)) << "D is done with it";
  in_place_ack::Announce(&word, tag);
  ASSERT_TRUE(in_place_ack::Revoke(&word, tag));
  EXPECT_FALSE(in_place_ack::Claim(&word, tag)) << "revoked";
  EXPECT_TRUE(in_place_ack::Revoke(&word, tag));
  // The buffer reused for another chunk: a late claim for the old tag
  // fails, and the new chunk's claim is unaffected.
  const uint64_t next = tag + (uint64_t{1} << 24);
  in_place_ack::Announce(&word, next);
  EXPECT_FALSE(in_place_ack::Claim(&word, tag));
  EXPECT_FALSE(in_place_ack::Revoke(&word, tag));
  EXPECT_TRUE(in_place_ack::Claim(&word, next));
  // Racing: a thread claims while another revokes, 20000 times.
  int claimed = 0, revoked = 0;
  for (int i = 0; i < 20000; ++i) {
    in_place_ack::Announce(&word, tag);
    bool claim = false, revoke = false;
    std::thread d([&] { claim = in_place_ack::Claim(&word, tag); });
    revoke = in_place_ack::Revoke(&word, tag);
    d.join();
    ASSERT_NE(claim, revoke) << "round " << i;
    claimed += claim;
    revoked += revoke;
  }
  EXPECT_EQ(claimed + revoked, 20000);
}

// P waits for D's release on a process-shared futex, not by polling (a P
// with hundreds of pushes waiting on a slow D spent 57% of a 2-core
// machine's CPU polling): another process's Release wakes it, and a word
// that already changed does not put it to sleep at all.
TEST(InPlaceAckTest, AwaitChangeSleepsUntilAnotherProcessReleases) {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  auto* word = static_cast<uint64_t*>(page);
  const uint64_t tag = (uint64_t{0x1234} << 24) | 3;
  in_place_ack::Announce(word, tag);
  ASSERT_TRUE(in_place_ack::Claim(word, tag));
  // Stale expectation: returns at once instead of sleeping 60 s.
  absl::Time start = absl::Now();
  in_place_ack::AwaitChange(word, in_place_ack::Announced(tag),
                            absl::Seconds(60));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // D: reads for a while, then releases
    absl::SleepFor(absl::Milliseconds(300));
    in_place_ack::Release(word, tag);
    _exit(0);
  }
  start = absl::Now();
  while (!in_place_ack::Released(word, tag) &&
         absl::Now() - start < absl::Seconds(60)) {
    in_place_ack::AwaitChange(word, in_place_ack::Claimed(tag),
                              absl::Seconds(60));
  }
  EXPECT_TRUE(in_place_ack::Released(word, tag));
  // Woken by the release, long before the timeout would have ended it.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  munmap(page, 4096);
}

// A decode worker that reads a chunk in place after the prefill worker gave
// up on the push (D stalled under overload) still reads the bytes P wrote
// for it: P does not reuse a buffer D claimed, however short its
// quarantine, and revokes the chunks D had not claimed (D refuses those,
// unread). Before, P reused such buffers after a 2 s quarantine: under
// overload D read a buffer another push had refilled, and a request ended
// with DATA_LOSS that no transfer had caused.
TEST_P(UcxInPlaceAckTest, ABufferDIsReadingIsNotReusedAfterPGaveUp) {
  factory_.hashes_chunks_ = true;  // as the decode worker's sinks
  StallFirstChunkOf("stalled");
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  UcxKvSender::Options o;
  o.quarantine = absl::ZeroDuration();  // a failed push's buffers at once
  auto sender = Sender(&grpc, nullptr, o);
  const KvLayout l = TestLayout();
  const pb::KvChunk first = MakeChunk(l, 0, 0, 4, 7);
  auto stream = sender->Open(target_, Header("stalled", 8, "model-a"),
                             absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stream.ok()) << stream.status();
  const uint64_t* first_ack = SendInPlace(*sender, **stream, first);
  ASSERT_NE(first_ack, nullptr);
  ASSERT_TRUE(reading_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // D is inside chunk 0's import, not yet reading its bytes; P announces
  // chunk 1 (D cannot take it yet), then gives up on the push.
  const uint64_t* second_ack =
      SendInPlace(*sender, **stream, MakeChunk(l, 0, 4, 8, 8));
  ASSERT_NE(second_ack, nullptr);
  (*stream)->Cancel();
  stream->reset();
  EXPECT_FALSE(Released(first_ack));
  // Chunk 1 was revoked: its buffer is reused by the next push at once.
  // Chunk 0's buffer is not (the old code reused it, and D read the new
  // push's bytes as chunk 0).
  std::vector<pb::KvChunk> sent;
  auto again = PushAll(*sender, "after", 8, &sent, "model-a", true);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSame("after", sent);
  ResumeD();
  for (int i = 0; i < 1000 && (factory_.Get("stalled").aborted.ok() ||
                               receiver_->active() > 0);
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const auto stalled = factory_.Get("stalled");
  EXPECT_FALSE(stalled.aborted.ok());
  EXPECT_FALSE(stalled.committed);
  ASSERT_GE(stalled.chunks.size(), 1u);
  EXPECT_EQ(stalled.chunks[0].data(), first.data())
      << "D read chunk 0 from a buffer P had reused";
  EXPECT_EQ(stalled.chunks.size(), 1u) << "D read a revoked chunk";
  EXPECT_EQ(service_->counters().checksum_failures.load(), 0);
  EXPECT_TRUE(Released(first_ack));
  EXPECT_EQ(sender->regions_in_use(), 0);
}

// A chunk P revoked stays mappable for a while: a decode worker that took
// its reference before P gave up maps the buffer before it finds the chunk
// revoked, and UCX 1.13 crashes unpacking the key of a freed segment (a
// decode worker died that way under overload). P's pool unregisters idle
// regions after pool_idle; a revoked one only after kMapGrace.
TEST_P(UcxInPlaceAckTest, ARevokedBufferStaysMappableForALateDecodeWorker) {
  StallFirstChunkOf("late");
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  UcxKvSender::Options o;
  o.quarantine = absl::ZeroDuration();
  o.pool_idle = absl::Milliseconds(1);
  o.warm_bytes = 0;
  auto sender = Sender(&grpc, nullptr, o);
  const KvLayout l = TestLayout();
  auto stream = sender->Open(target_, Header("late", 8, "model-a"),
                             absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_NE(SendInPlace(*sender, **stream, MakeChunk(l, 0, 0, 4, 7)), nullptr);
  ASSERT_TRUE(reading_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Chunk 1 is announced while D is busy with chunk 0, then revoked.
  std::string rkey;
  const uint64_t* second_ack =
      SendInPlace(*sender, **stream, MakeChunk(l, 0, 4, 8, 8), &rkey);
  ASSERT_NE(second_ack, nullptr);
  const uint64_t address = reinterpret_cast<uint64_t>(second_ack);
  (*stream)->Cancel();
  stream->reset();
  EXPECT_EQ(__atomic_load_n(second_ack, __ATOMIC_ACQUIRE) >> 62, 3u)
      << "chunk 1 not revoked";
  absl::SleepFor(absl::Milliseconds(400));  // the reaper ran since
  auto late = d_worker_->MapRemote(p_worker_->address(), rkey);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_NE((*late)->Pointer(address), nullptr);
  late->reset();
  ResumeD();
  for (int i = 0; i < 1000 && receiver_->active() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(sender->regions_in_use(), 0);
}

// A decode worker that maps a prefill worker's buffer after that worker
// died (kill -9 between its push header and D's mapping) gets an error, not
// a crash: UCX cannot attach the dead process's segment, and its unpack
// must not be trusted after it said so. Seen in ChaosSoak under load:
// "failed to unpack remote key ... Shared memory error", then SIGSEGV.
TEST(UcxRemoteMemoryTest, TheKeyOfAPeerThatDiedIsRefusedNotACrash) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // P: allocates a shared buffer, says where, waits
    close(pipe_fds[0]);
    auto worker = UcxWorker::Create();
    if (!worker.ok()) _exit(1);
    auto region = (*worker)->AllocateShared(1 << 20);
    if (!region.ok()) _exit(1);
    std::memset((*region)->data(), 7, 64);
    const uint64_t address = reinterpret_cast<uint64_t>((*region)->data());
    for (const std::string& field :
         {(*worker)->address(), (*region)->packed_rkey(),
          std::string(reinterpret_cast<const char*>(&address), 8)}) {
      const uint64_t size = field.size();
      if (write(pipe_fds[1], &size, 8) != 8 ||
          write(pipe_fds[1], field.data(), size) !=
              static_cast<ssize_t>(size)) {
        _exit(1);
      }
    }
    for (;;) pause();
  }
  close(pipe_fds[1]);
  std::vector<std::string> fields;
  for (int i = 0; i < 3; ++i) {
    uint64_t size = 0;
    ASSERT_EQ(read(pipe_fds[0], &size, 8), 8);
    std::string field(size, '\0');
    size_t got = 0;
    while (got < size) {
      const ssize_t n = read(pipe_fds[0], field.data() + got, size - got);
      ASSERT_GT(n, 0);
      got += static_cast<size_t>(n);
    }
    fields.push_back(std::move(field));
  }
  close(pipe_fds[0]);
  uint64_t address = 0;
  std::memcpy(&address, fields[2].data(), 8);
  auto d = UcxWorker::Create();
  ASSERT_TRUE(d.ok()) << d.status();
  {
    // Alive: the buffer maps and holds what P wrote.
    auto alive = (*d)->MapRemote(fields[0], fields[1]);
    ASSERT_TRUE(alive.ok()) << alive.status();
    const void* p = (*alive)->Pointer(address);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(*static_cast<const uint8_t*>(p), 7);
  }
  // The endpoint to P stays cached (D pushes from P all the time), so D
  // does not notice P's death before it unpacks the key.
  auto cached = (*d)->Connect(fields[0], /*peer_errors=*/false);
  ASSERT_TRUE(cached.ok()) << cached.status();
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // D's mapping above ended with its scope, so the segment died with P:
  // every later mapping is refused, before UCX unpacks the key (its failure
  // path is the crash).
  for (int i = 0; i < 3; ++i) {
    auto dead = (*d)->MapRemote(fields[0], fields[1]);
    ASSERT_FALSE(dead.ok()) << "mapping " << i << " of a dead peer's key";
    EXPECT_EQ(dead.status().code(), absl::StatusCode::kUnavailable)
        << dead.status();
    EXPECT_TRUE(absl::StrContains(dead.status().message(), "the peer exited"))
        << dead.status();
  }
}

INSTANTIATE_TEST_SUITE_P(SharedMemory, UcxInPlaceAckTest, ::testing::Values(""),
                         [](const auto&) { return std::string("Default"); });

}  // namespace
}  // namespace pdserve::transport
