// Tests of UCX KV pushes over loopback, P and D in this process with a UCX
// worker each, with UCX's default transports and with UCX_TLS=tcp: every
// chunk identical, checksums verified as for gRPC, region reuse and
// release, chunks left in place and how they are written, corruption,
// cancellation and the fallbacks when the decode worker takes no UCX or
// cannot reach this worker (the in-place handoff's own protocol:
// ucx_in_place_test.cc). Part of ucx_transport_test.
#include <stdlib.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/transport/grpc_kv_transport.h"
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
  o.warm_bytes = 0;  // none kept warm past the idle time
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
  ExpectPoolEmptiesWithin10s(*sender);
}

// The regions returned last, up to warm_bytes, stay registered past the
// idle time while pushes succeed: the next push after a pause registers
// nothing. After a failed push none stays.
TEST_P(UcxPushTest, RecentRegionsStayWarmPastTheIdleTime) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  UcxKvSender::Options o;
  o.pool_idle = absl::Milliseconds(100);
  auto sender = Sender(&grpc, nullptr, o);
  for (const std::string id : {"before-pause", "after-pause"}) {
    std::vector<pb::KvChunk> sent;
    auto result = PushAll(*sender, id, 10, &sent);
    ASSERT_TRUE(result.ok()) << result.status();
    ExpectSame(id, sent);
    EXPECT_EQ(p_worker_->counters().registrations.load(), 1);
    absl::SleepFor(absl::Milliseconds(600));  // the reaper ran since
    EXPECT_EQ(sender->pooled_regions(), 1);
    EXPECT_EQ(p_worker_->counters().registrations.load(), 1);
    EXPECT_LE(p_worker_->counters().registered_bytes.load(),
              UcxKvSender::kWarmBytes);
  }
  // A push that fails (cancelled here; a dead decode worker alike): its
  // region returns unclean, and nothing stays warm after the idle time
  // and the quarantine.
  auto stream = sender->Open(target_, Header("cancelled", 8),
                             absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->Send(MakeChunk(TestLayout(), 0, 0, 8, 3)).ok());
  (*stream)->Cancel();
  EXPECT_FALSE((*stream)->Commit(pb::KvCommit()).ok());
  stream->reset();
  ExpectPoolEmptiesWithin10s(*sender);
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

// Chunks left in place and chunks sent as messages alternate within one
// push: D posts each message's successor's receive ahead, and cancels it
// when that chunk stays in place instead. Every chunk arrives identical
// and no receive stays posted.
TEST_P(UcxPushTest, ChunksInPlaceAndAsMessagesMixInOnePush) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  auto sender = Sender(&grpc, nullptr);
  for (const std::string id : {"mixed-1", "mixed-2"}) {
    std::vector<pb::KvChunk> sent;
    auto result = PushAll(*sender, id, 10, &sent, "model-a", true, true);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->transport, "ucx");
    ExpectSame(id, sent);
    EXPECT_EQ(d_worker_->counters().ops_in_flight.load(), 0);
    EXPECT_EQ(receiver_->landing_buffers_in_use(), 0);
  }
  // Two landing buffers a push at most (D may return the first push's
  // after the second took its own: they then stay pooled).
  EXPECT_LE(d_worker_->counters().registrations.load(), 4);
}

// A buffer D reads in place is filled the way the sender measures hands
// chunks over fastest (AdaptiveStores; PDSERVE_KV_EXPORT_STORES pins it),
// one sent as a message with ordinary stores; either way the chunks
// arrive identical.
TEST_P(UcxPushTest, InPlaceBuffersAreFilledAsTheSenderMeasures) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  setenv("PDSERVE_KV_EXPORT_STORES", "streaming", 1);
  auto pinned = Sender(&grpc, nullptr);
  unsetenv("PDSERVE_KV_EXPORT_STORES");
  auto adaptive = Sender(&grpc, nullptr);
  const bool in_place = GetParam().empty();  // shared memory, not TCP
  auto fill_stores = [&](UcxKvSender& sender, int64_t bytes) {
    std::unique_ptr<KvChunkBuffer> buffer =
        sender.NewChunkBuffer(target_, bytes);
    Stores used = Stores::kCached;
    EXPECT_TRUE(buffer
                    ->Fill([&](Stores stores) {
                      used = stores;
                      std::memset(buffer->data(), 7, buffer->size());
                      return absl::OkStatus();
                    })
                    .ok());
    return used;
  };
  ASSERT_TRUE(pinned->UcxUsable(target_, absl::Now() + absl::Seconds(10)).ok());
  ASSERT_TRUE(
      adaptive->UcxUsable(target_, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(fill_stores(*pinned, 1 << 20),
            in_place ? Stores::kStreaming : Stores::kCached);
  // Adaptive: ordinary stores first, and the fill's time is recorded.
  EXPECT_EQ(fill_stores(*adaptive, 1 << 20), Stores::kCached);
  EXPECT_EQ(adaptive->in_place_stores()->SecondsPerGb(Stores::kCached) > 0,
            in_place);
  for (const std::string id : {"streamed-1", "streamed-2"}) {
    std::vector<pb::KvChunk> sent;
    auto result = PushAll(*pinned, id, 10, &sent, "model-a", true);
    ASSERT_TRUE(result.ok()) << result.status();
    ExpectSame(id, sent);
  }
  EXPECT_EQ(pinned->regions_in_use(), 0);
  EXPECT_EQ(adaptive->regions_in_use(), 0);
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

}  // namespace
}  // namespace pdserve::transport
