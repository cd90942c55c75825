// Tests of the UCX KV transport over loopback, P and D in this process with
// a UCX worker each: the worker (registration, endpoints, gets and what they
// hold), pushes with UCX's default transports and with UCX_TLS=tcp (every
// chunk identical, checksums verified as for gRPC), region reuse and
// release, corruption, cancellation and the fallbacks when the decode
// worker takes no UCX or cannot reach this worker.
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_transports.h"
#include "common/transport/ucx_kv_receiver.h"
#include "common/transport/ucx_kv_sender.h"
#include "common/transport/ucx_worker.h"
#include "common/util/subprocess.h"
#include "gtest/gtest.h"
#include "tests/unit/transport_test_util.h"

namespace pdserve::transport {
namespace {

// A UCX worker started with UCX_TLS=`tls` ("" = UCX's default).
std::unique_ptr<UcxWorker> WorkerWithTls(const std::string& tls) {
  const char* old = getenv("UCX_TLS");
  const std::string saved = old != nullptr ? old : "";
  if (tls.empty()) {
    unsetenv("UCX_TLS");
  } else {
    setenv("UCX_TLS", tls.c_str(), 1);
  }
  auto w = UcxWorker::Create();
  if (old != nullptr) {
    setenv("UCX_TLS", saved.c_str(), 1);
  } else {
    unsetenv("UCX_TLS");
  }
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

TEST(UcxTlsTest, SharedMemoryAllowed) {
  EXPECT_TRUE(UcxTlsAllowsSharedMemory(""));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("all"));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("sm,tcp"));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("rc,cma"));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("^tcp"));
  EXPECT_FALSE(UcxTlsAllowsSharedMemory("tcp"));
  EXPECT_FALSE(UcxTlsAllowsSharedMemory("rc,ud"));
  EXPECT_FALSE(UcxTlsAllowsSharedMemory("^sm"));
  EXPECT_TRUE(ParseUcxMemoryType("host").ok());
  EXPECT_EQ(*ParseUcxMemoryType("cuda"), UcxMemoryType::kCuda);
  EXPECT_FALSE(ParseUcxMemoryType("tpu").ok());
  EXPECT_FALSE(UcxHostId().empty());
}

class UcxWorkerTest : public ::testing::TestWithParam<std::string> {};

// One worker sends from its registered memory, another receives into its
// own; everything they held is released with the regions (the sender's
// endpoint stays cached for the next transfer).
TEST_P(UcxWorkerTest, TaggedMessagesMoveRegisteredMemory) {
  auto p = WorkerWithTls(GetParam());
  auto d = WorkerWithTls(GetParam());
  ASSERT_NE(p, nullptr);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(p->transports(), GetParam().empty() ? "all" : GetParam());
  {
    auto src = p->Allocate(3 << 20);
    ASSERT_TRUE(src.ok()) << src.status();
    const std::string bytes = RandomBytes((*src)->size(), 7);
    std::memcpy((*src)->data(), bytes.data(), bytes.size());
    auto landing = d->Allocate(1 << 20);
    ASSERT_TRUE(landing.ok()) << landing.status();
    EXPECT_EQ(p->counters().registrations.load(), 1);
    auto conn = p->Connect(d->address(), GetParam() == "tcp");
    ASSERT_TRUE(conn.ok()) << conn.status();
    EXPECT_EQ(p->counters().endpoints.load(), 1);
    auto never = [] { return false; };
    uint64_t tag = 100;
    for (int64_t off : {int64_t{0}, int64_t{1} << 20, int64_t{2} << 20}) {
      // Small (eager) and large (rendezvous) messages alike.
      for (int64_t n : {int64_t{64}, int64_t{1} << 20}) {
        auto sent = p->Send(**conn, **src, off, n, ++tag);
        ASSERT_TRUE(sent.ok()) << sent.status();
        auto got = d->Receive(**landing, 0, (*landing)->size(), tag, never);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, n);
        EXPECT_EQ(std::string((*landing)->data(), n), bytes.substr(off, n));
        ASSERT_TRUE(sent->Wait(absl::Seconds(10)));
        EXPECT_TRUE(sent->status().ok()) << sent->status();
      }
    }
    // A message larger than the receive: DATA_LOSS, never an overflow.
    auto big = p->Send(**conn, **src, 0, 1024, ++tag);
    ASSERT_TRUE(big.ok());
    EXPECT_TRUE(
        absl::IsDataLoss(d->Receive(**landing, 0, 64, tag, never).status()));
    // Outside the regions: refused before UCX.
    EXPECT_TRUE(absl::IsInvalidArgument(
        p->Send(**conn, **src, (*src)->size() - 10, 100, 1).status()));
    EXPECT_TRUE(absl::IsInvalidArgument(
        d->Receive(**landing, 0, (*landing)->size() + 1, 1, never).status()));
    (void)big->Wait(absl::Seconds(10));
  }
  EXPECT_EQ(p->counters().registrations.load(), 0);
  EXPECT_EQ(p->counters().registered_bytes.load(), 0);
  EXPECT_EQ(d->counters().registrations.load(), 0);
  EXPECT_EQ(p->counters().endpoints.load(), 1);  // cached for the next push
  EXPECT_EQ(p->counters().ops_in_flight.load(), 0);
  EXPECT_EQ(d->counters().ops_in_flight.load(), 0);
}

// A receive nobody sends to ends once cancelled; messages of an abandoned
// transfer are received and discarded, so their sends complete.
TEST_P(UcxWorkerTest, CancelledReceivesEndAndAbandonedMessagesAreDrained) {
  auto p = WorkerWithTls(GetParam());
  auto d = WorkerWithTls(GetParam());
  ASSERT_NE(p, nullptr);
  ASSERT_NE(d, nullptr);
  auto src = p->Allocate(4 << 20);
  auto landing = d->Allocate(4 << 20);
  ASSERT_TRUE(src.ok() && landing.ok());
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cancel = true;
  });
  auto got = d->Receive(**landing, 0, 4096, 7, [&] { return cancel.load(); });
  canceller.join();
  EXPECT_TRUE(absl::IsCancelled(got.status())) << got.status();
  auto conn = p->Connect(d->address(), GetParam() == "tcp");
  ASSERT_TRUE(conn.ok());
  const uint64_t prefix = uint64_t{0xabc} << 24;
  d->DrainLater(prefix, ~((uint64_t{1} << 24) - 1), absl::Seconds(30));
  std::vector<UcxSendOp> sends;
  for (uint64_t i = 0; i < 3; ++i) {
    auto s = p->Send(**conn, **src, 0, 4 << 20, prefix | i);
    ASSERT_TRUE(s.ok());
    sends.push_back(*std::move(s));
  }
  for (UcxSendOp& s : sends) {
    ASSERT_TRUE(s.Wait(absl::Seconds(20))) << "an abandoned send never ended";
    EXPECT_TRUE(s.status().ok()) << s.status();
  }
  EXPECT_GE(d->counters().drained.load(), 3);
}

TEST_P(UcxWorkerTest, CloseEndsSendsAndTheNextConnectReconnects) {
  auto p = WorkerWithTls(GetParam());
  auto d = WorkerWithTls(GetParam());
  ASSERT_NE(p, nullptr);
  ASSERT_NE(d, nullptr);
  auto src = p->Allocate(4 << 20);
  auto landing = d->Allocate(4 << 20);
  ASSERT_TRUE(src.ok() && landing.ok());
  auto first = p->Connect(d->address(), GetParam() == "tcp");
  ASSERT_TRUE(first.ok()) << first.status();
  // Nobody receives this one: closing the endpoint ends it.
  auto stuck = p->Send(**first, **src, 0, 4 << 20, 1);
  ASSERT_TRUE(stuck.ok());
  EXPECT_FALSE(stuck->Wait(absl::Milliseconds(100)));
  p->Close(**first);
  EXPECT_EQ(p->counters().endpoints.load(), 0);
  if (GetParam() == "tcp") {
    ASSERT_TRUE(stuck->Wait(absl::Seconds(10)));
    EXPECT_FALSE(stuck->status().ok());
  } else if (!stuck->Wait(absl::Seconds(1))) {
    // UCX 1.13 over shared memory keeps a rendezvous waiting for its peer
    // even on a closed endpoint: given up on, it no longer counts.
    stuck->Abandon();
    EXPECT_EQ(p->counters().ops_in_flight.load(),
              p->counters().ops_abandoned.load());
  }
  // A send on the closed endpoint fails instead of hanging.
  EXPECT_FALSE(p->Send(**first, **src, 0, 64, 2).ok());
  first->reset();
  auto second = p->Connect(d->address(), GetParam() == "tcp");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(p->counters().endpoints.load(), 1);
  auto sent = p->Send(**second, **src, 0, 4096, 3);
  ASSERT_TRUE(sent.ok());
  auto got = d->Receive(**landing, 0, 4096, 3, [] { return false; });
  EXPECT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(sent->Wait(absl::Seconds(10)));
  // D never saw message 1: it sits in D's unexpected queue; drain it so the
  // workers can shut down cleanly.
  d->DrainLater(1, ~uint64_t{0}, absl::Seconds(1));
}

// An address of another format is refused before UCX sees it (UCX aborts
// the process on one it cannot parse).
TEST(UcxWorkerTest, ForeignAddressIsRefused) {
  auto p = WorkerWithTls("");
  ASSERT_NE(p, nullptr);
  std::string junk(64, '\x7f');
  junk[0] = static_cast<char>(p->address()[0] ^ 0x01);
  EXPECT_TRUE(absl::IsInvalidArgument(p->Connect(junk, true).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(p->Connect("", true).status()));
  EXPECT_EQ(p->counters().endpoints.load(), 0);
}

// A peer killed after announcing rendezvous messages (their RTS wait in
// D's unexpected queue; the peer is in another process, connected as a
// same-host prefill worker is, without peer-failure mode): UCX tears down
// D's endpoint to it when it notices the death, and receiving or draining
// those messages afterwards ends instead of touching that endpoint (UCX 1.13
// aborts in ucp_rndv_receive on a freed endpoint unless endpoint ids are
// indirect, which UcxWorker turns on).
TEST(UcxPeerDeathTest, RendezvousOfAKilledPeerEndsItsReceiveAndDrain) {
  auto d = WorkerWithTls("");
  ASSERT_NE(d, nullptr);
  const uint64_t tag = 0x5100;
  // Killed and reaped when it goes out of scope, whatever happens below.
  auto helper = Subprocess::Start({PDSERVE_UCX_PEER_HELPER,
                                   absl::BytesToHexString(d->address()),
                                   absl::StrCat(tag)});
  ASSERT_TRUE(helper.ok()) << helper.status();

  auto landing = d->Allocate(4 << 20);
  ASSERT_TRUE(landing.ok()) << landing.status();
  // The eager message comes after both announcements (UCX keeps a sender's
  // order), so once it is here, so are they.
  const absl::Time start_wait = absl::Now();
  auto small = d->Receive(**landing, 0, 64, tag + 1, [&] {
    return helper->Poll().has_value() ||
           absl::Now() - start_wait > absl::Seconds(30);
  });
  ASSERT_TRUE(small.ok()) << "the UCX peer helper sent nothing: "
                          << small.status();
  EXPECT_EQ(*small, 64);

  helper->Signal(SIGKILL);
  ASSERT_TRUE(helper->Wait(absl::Seconds(10)).ok());
  // D's UCX notices the closed connection on its next progress.
  absl::SleepFor(absl::Seconds(1));

  // UCX ends the receive itself; the caller's cancellation (after 30 s)
  // is only a backstop.
  const absl::Time start = absl::Now();
  bool gave_up = false;
  auto got = d->Receive(**landing, 0, 4 << 20, tag, [&] {
    gave_up = gave_up || absl::Now() - start > absl::Seconds(30);
    return gave_up;
  });
  // UNAVAILABLE (the peer's endpoint failed) or CANCELLED (already gone).
  EXPECT_TRUE(absl::IsUnavailable(got.status()) ||
              absl::IsCancelled(got.status()))
      << got.status();
  EXPECT_FALSE(gave_up);
  const int64_t drained = d->counters().drained.load();
  d->DrainLater(tag + 2, ~uint64_t{0}, absl::Milliseconds(300));
  for (int i = 0; i < 100 && d->counters().drained.load() == drained; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(d->counters().drained.load(), drained + 1);
  absl::SleepFor(absl::Milliseconds(500));  // the drain's receive ends
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxWorkerTest,
                         ::testing::Values("", "tcp"), [](const auto& info) {
                           return info.param.empty() ? std::string("Default")
                                                     : std::string("Tcp");
                         });

// A receiving service that accepts UCX pushes (D's worker), and a UCX
// sender (P's worker) with gRPC as its fallback; UCX_TLS = the parameter.
class UcxPushTest : public GrpcTransportTest,
                    public ::testing::WithParamInterface<std::string> {
 protected:
  KvReceiveOptions ReceiveOptions() override {
    d_worker_ = WorkerWithTls(GetParam());
    receiver_ = std::make_unique<UcxKvReceiver>(d_worker_.get(), 1 << 20);
    KvReceiveOptions o;
    o.ucx = receiver_.get();
    return o;
  }
  void SetUp() override {
    GrpcTransportTest::SetUp();
    p_worker_ = WorkerWithTls(GetParam());
    ASSERT_NE(p_worker_, nullptr);
    ASSERT_NE(d_worker_, nullptr);
  }
  void TearDown() override {
    GrpcTransportTest::TearDown();
    // Nothing of a finished push stays held on D.
    EXPECT_EQ(d_worker_->counters().ops_in_flight.load(), 0);
    EXPECT_EQ(receiver_->active(), 0);
    EXPECT_EQ(receiver_->landing_buffers_in_use(), 0);
  }
  std::unique_ptr<UcxKvSender> Sender(GrpcKvSender* grpc, KvSender* fallback,
                                      UcxKvSender::Options o = {}) {
    return std::make_unique<UcxKvSender>(grpc, p_worker_.get(), fallback, o);
  }
  void ExpectSame(const std::string& id, const std::vector<pb::KvChunk>& sent) {
    auto rec = factory_.Get(id);
    EXPECT_TRUE(rec.committed);
    ASSERT_EQ(rec.chunks.size(), sent.size());
    for (size_t i = 0; i < sent.size(); ++i) {
      EXPECT_EQ(rec.chunks[i].data(), sent[i].data()) << i;
      EXPECT_EQ(rec.chunks[i].layer(), sent[i].layer());
      EXPECT_EQ(rec.chunks[i].token_begin(), sent[i].token_begin());
      EXPECT_EQ(rec.chunks[i].token_end(), sent[i].token_end());
      EXPECT_EQ(rec.chunks[i].xxh3(), sent[i].xxh3());
    }
  }

  std::unique_ptr<UcxWorker> p_worker_, d_worker_;
  std::unique_ptr<UcxKvReceiver> receiver_;
};

TEST_P(UcxPushTest, PushDeliversIdenticalChunks) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  auto sender = Sender(&grpc, &grpc);
  auto usable = sender->UcxUsable(target_, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(usable.ok()) << usable.status();
  EXPECT_TRUE(*usable);
  std::vector<pb::KvChunk> sent;
  auto result = PushAll(*sender, "ucx-ok", 10, &sent);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->transport, "ucx");
  const int64_t expected = TestLayout().BytesPerTokenPerLayer() * 10 * 3;
  EXPECT_EQ(result->bytes, expected);
  ExpectSame("ucx-ok", sent);
  EXPECT_EQ(factory_.Get("ucx-ok").first_token, 42);
  EXPECT_EQ(service_->counters().ucx_pushes.load(), 1);
  EXPECT_EQ(service_->counters().bytes.load(), expected);
  EXPECT_EQ(sender->regions_in_use(), 0);
}

TEST_P(UcxPushTest, RegionsAreReusedThenUnregisteredWhenIdle) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  UcxKvSender::Options o;
  o.pool_idle = absl::Milliseconds(300);
  auto sender = Sender(&grpc, nullptr, o);
  // A larger push, then a smaller one that fits the same pooled region.
  for (auto [id, tokens] : {std::pair<std::string, int>{"big", 10},
                            std::pair<std::string, int>{"small", 6}}) {
    std::vector<pb::KvChunk> sent;
    auto result = PushAll(*sender, id, tokens, &sent);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->transport, "ucx");
    ExpectSame(id, sent);
    EXPECT_EQ(sender->pooled_regions(), 1);
    EXPECT_EQ(p_worker_->counters().registrations.load(), 1);
  }
  for (int i = 0; i < 500 && p_worker_->counters().registrations.load() > 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(p_worker_->counters().registrations.load(), 0);
  EXPECT_EQ(sender->pooled_regions(), 0);
}

TEST_P(UcxPushTest, CorruptedBytesAreDataLoss) {
  KvFaultInjection faults;
  faults.corrupt_chunk = 2;
  GrpcKvSender grpc(grpc::InsecureChannelCredentials(), faults);
  auto sender = Sender(&grpc, nullptr);
  auto result = PushAll(*sender, "ucx-bad", 10, nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsDataLoss(result.status())) << result.status();
  auto rec = factory_.Get("ucx-bad");
  EXPECT_FALSE(rec.committed);
  EXPECT_TRUE(absl::IsDataLoss(rec.aborted));
  EXPECT_EQ(rec.chunks.size(), 2u);  // the two good chunks before it
  EXPECT_EQ(service_->counters().checksum_failures.load(), 1);
  EXPECT_EQ(service_->counters().ucx_pushes.load(), 1);
  EXPECT_EQ(sender->regions_in_use(), 0);

  // The same with a sink that hashes while importing (the decode worker's):
  // it saw the bad chunk, which the service then refused.
  factory_.hashes_chunks_ = true;
  result = PushAll(*sender, "ucx-bad-hashed", 10, nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsDataLoss(result.status())) << result.status();
  rec = factory_.Get("ucx-bad-hashed");
  EXPECT_FALSE(rec.committed);
  EXPECT_TRUE(absl::IsDataLoss(rec.aborted));
  EXPECT_EQ(rec.chunks.size(), 3u);
  EXPECT_EQ(service_->counters().checksum_failures.load(), 2);
  EXPECT_EQ(sender->regions_in_use(), 0);
}

// Chunks exported into the sender's registered buffers go out in place:
// identical bytes, buffers back to the pool when their sends end (reused
// by the next push: no new registration), and a corrupted one is
// DATA_LOSS with every buffer returned.
TEST_P(UcxPushTest, ChunksSentInPlaceArriveIdenticalAndBuffersAreReused) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  auto sender = Sender(&grpc, nullptr);
  int64_t registrations = 0;
  for (const std::string id : {"in-place-1", "in-place-2"}) {
    std::vector<pb::KvChunk> sent;
    auto result = PushAll(*sender, id, 10, &sent, "model-a", true);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->transport, "ucx");
    ExpectSame(id, sent);
    EXPECT_EQ(sender->regions_in_use(), 0);
    if (registrations == 0) {
      registrations = p_worker_->counters().registrations.load();
      // The ring and the buffers of the sends in flight at once.
      EXPECT_GE(registrations, 2);
      EXPECT_LE(registrations, 1 + UcxKvSender::kSlots + 1);
    } else {
      // Reused: this push registers only what it had in flight beyond the
      // first push's peak (timing decides that), fewer buffers than it
      // sent chunks; a pool that did not reuse would register one per
      // chunk.
      EXPECT_LT(p_worker_->counters().registrations.load(),
                registrations + static_cast<int64_t>(sent.size()));
      EXPECT_LE(p_worker_->counters().registrations.load(),
                1 + UcxKvSender::kSlots + 1);
    }
  }
  // An unsent buffer goes back too.
  sender->NewChunkBuffer(target_, 4096).reset();
  EXPECT_EQ(sender->regions_in_use(), 0);
  // Over shared memory D mapped P's buffers and read the chunks in place
  // (the probe in Describe succeeded); over TCP they went as messages.
  auto peer = sender->PeerOf(target_, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(peer.ok());
  // A push read in place takes no landing buffer: D registered nothing.
  if (GetParam().empty()) {
    EXPECT_TRUE(peer->in_place);
    EXPECT_GT(receiver_->mapped_buffers(), 0);
    EXPECT_EQ(d_worker_->counters().registrations.load(), 0);
  } else {
    EXPECT_FALSE(peer->in_place);
    EXPECT_EQ(receiver_->mapped_buffers(), 0);
    EXPECT_GT(d_worker_->counters().registrations.load(), 0);
  }

  KvFaultInjection faults;
  faults.corrupt_chunk = 2;
  GrpcKvSender bad_grpc(grpc::InsecureChannelCredentials(), faults);
  auto bad = Sender(&bad_grpc, nullptr);
  auto result = PushAll(*bad, "in-place-bad", 10, nullptr, "model-a", true);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsDataLoss(result.status())) << result.status();
  EXPECT_FALSE(factory_.Get("in-place-bad").committed);
  EXPECT_EQ(bad->regions_in_use(), 0);
}

TEST_P(UcxPushTest, CancelMidPushAbortsTheSinkAndReleasesEverything) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  auto sender = Sender(&grpc, nullptr);
  auto stream = sender->Open(target_, Header("ucx-cancel", 8),
                             absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->Send(MakeChunk(TestLayout(), 0, 0, 8, 3)).ok());
  for (int i = 0; i < 1000 && factory_.Get("ucx-cancel").chunks.empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(factory_.Get("ucx-cancel").chunks.size(), 1u);
  EXPECT_EQ(receiver_->active(), 1);
  (*stream)->Cancel();
  EXPECT_FALSE((*stream)->Commit(pb::KvCommit()).ok());
  for (int i = 0; i < 1000 && factory_.Get("ucx-cancel").aborted.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(factory_.Get("ucx-cancel").aborted.ok());
  EXPECT_FALSE(factory_.Get("ucx-cancel").committed);
  for (int i = 0; i < 1000 && receiver_->active() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(receiver_->active(), 0);
  stream->reset();
  EXPECT_EQ(sender->regions_in_use(), 0);
  EXPECT_EQ(p_worker_->counters().ops_in_flight.load(), 0);
  // A push that did not commit cannot tell a client's cancel from one sent
  // because D died: its endpoint is closed, and the next push to the live D
  // connects afresh.
  EXPECT_EQ(p_worker_->counters().endpoints.load(), 0);
  std::vector<pb::KvChunk> sent;
  auto again = PushAll(*sender, "ucx-after-cancel", 6, &sent);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->transport, "ucx");
  ExpectSame("ucx-after-cancel", sent);
  EXPECT_EQ(p_worker_->counters().endpoints.load(), 1);
}

// D takes no UCX pushes: auto mode pushes over the fallback, ucx mode fails.
TEST_P(UcxPushTest, DecodeWorkerWithoutUcxGetsTheFallback) {
  RecordingFactory plain_factory;
  KvTransferService plain(&plain_factory, KvReceiveOptions{nullptr});
  ServerOptions opts;
  opts.address = "127.0.0.1:0";
  opts.services = {&plain};
  auto started = StartServer(opts);
  ASSERT_TRUE(started.ok());
  const std::string target = absl::StrCat("127.0.0.1:", started->port);
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  auto sender = Sender(&grpc, &grpc);
  auto usable = sender->UcxUsable(target, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(usable.ok());
  EXPECT_FALSE(*usable);
  auto s =
      sender->Open(target, Header("plain", 4), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->Send(MakeChunk(TestLayout(), 0, 0, 4, 1)).ok());
  auto strict = Sender(&grpc, nullptr);
  auto refused =
      strict->Open(target, Header("must", 4), absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  (*s)->Cancel();
  started->server->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxPushTest, ::testing::Values("", "tcp"),
                         [](const auto& info) {
                           return info.param.empty() ? std::string("Default")
                                                     : std::string("Tcp");
                         });

// P's worker has only TCP, D's only shared memory: P cannot reach D's
// worker, so the push goes to the fallback before anything was sent (or
// fails without one).
class UcxUnreachableTest : public GrpcTransportTest {
 protected:
  KvReceiveOptions ReceiveOptions() override {
    d_worker_ = WorkerWithTls("sm");
    receiver_ = std::make_unique<UcxKvReceiver>(d_worker_.get(), 1 << 20);
    return KvReceiveOptions{receiver_.get()};
  }
  std::unique_ptr<UcxWorker> d_worker_;
  std::unique_ptr<UcxKvReceiver> receiver_;
};

TEST_F(UcxUnreachableTest, PushGoesToTheFallback) {
  auto p_worker = WorkerWithTls("tcp");
  ASSERT_NE(p_worker, nullptr);
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  UcxKvSender sender(&grpc, p_worker.get(), &grpc);
  std::vector<pb::KvChunk> sent;
  auto result = PushAll(sender, "fallback", 10, &sent);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->transport, "grpc");
  auto rec = factory_.Get("fallback");
  EXPECT_TRUE(rec.committed);
  ASSERT_EQ(rec.chunks.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(rec.chunks[i].data(), sent[i].data()) << i;
  }
  EXPECT_EQ(service_->counters().ucx_pushes.load(), 0);
  // Chunks exported into the UCX sender's buffers reach the fallback too.
  sent.clear();
  result = PushAll(sender, "fallback-in-place", 10, &sent, "model-a", true);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->transport, "grpc");
  rec = factory_.Get("fallback-in-place");
  EXPECT_TRUE(rec.committed);
  ASSERT_EQ(rec.chunks.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(rec.chunks[i].data(), sent[i].data()) << i;
  }
  EXPECT_EQ(sender.regions_in_use(), 0);
  // Without a fallback the push fails at once.
  UcxKvSender strict(&grpc, p_worker.get(), nullptr);
  EXPECT_FALSE(PushAll(strict, "strict", 4, nullptr).ok());
  EXPECT_TRUE(factory_.Get("strict").chunks.empty());
}

// --kv_transport builds the sender stack it names.
TEST(KvTransportsTest, ModesBuildTheirStacks) {
  EXPECT_FALSE(ParseKvTransportMode("rdma").ok());
  EXPECT_FALSE(ParseKvTransportMode("shm").ok());  // removed: UCX does it
  for (auto [name, ucx] : {std::pair<const char*, bool>{"auto", true},
                           {"ucx", true},
                           {"grpc", false}}) {
    auto mode = ParseKvTransportMode(name);
    ASSERT_TRUE(mode.ok()) << name;
    auto send =
        KvSendTransports::Create(*mode, grpc::InsecureChannelCredentials());
    ASSERT_TRUE(send.ok()) << name << ": " << send.status();
    EXPECT_EQ((*send)->ucx() != nullptr, ucx) << name;
    auto recv = KvReceiveTransports::Create(*mode, 1 << 20);
    ASSERT_TRUE(recv.ok()) << name;
    EXPECT_EQ((*recv)->options().ucx != nullptr, ucx) << name;
  }
}

}  // namespace
}  // namespace pdserve::transport
