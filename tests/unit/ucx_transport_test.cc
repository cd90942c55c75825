// Tests of the UCX KV transport over loopback, P and D in this process with
// a UCX worker each: the worker (registration, endpoints, gets and what they
// hold), a killed peer, and the --kv_transport stacks. The pushes are in
// ucx_push_test.cc (the same test binary).
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <cstring>
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
#include "common/util/scoped_env.h"
#include "common/util/subprocess.h"
#include "gtest/gtest.h"
#include "tests/unit/transport_test_util.h"
#include "tests/unit/ucx_test_util.h"

namespace pdserve::transport {
namespace {

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

// Receives posted ahead of their messages (as D posts the next chunk's
// while it imports this one) take them in any order; one nobody sends to
// ends when cancelled and takes nothing afterwards; a message larger than
// the posted receive is DATA_LOSS.
TEST_P(UcxWorkerTest, ReceivesPostedAheadTakeTheirMessagesOrAreCancelled) {
  auto p = WorkerWithTls(GetParam());
  auto d = WorkerWithTls(GetParam());
  ASSERT_NE(p, nullptr);
  ASSERT_NE(d, nullptr);
  {
    auto src = p->Allocate(4 << 20);
    auto a = d->Allocate(2 << 20);
    auto b = d->Allocate(2 << 20);
    ASSERT_TRUE(src.ok() && a.ok() && b.ok());
    const std::string bytes = RandomBytes((*src)->size(), 11);
    std::memcpy((*src)->data(), bytes.data(), bytes.size());
    auto conn = p->Connect(d->address(), GetParam() == "tcp");
    ASSERT_TRUE(conn.ok()) << conn.status();
    auto never = [] { return false; };
    auto first = d->PostReceive(**a, 0, (*a)->size(), 21);
    auto second = d->PostReceive(**b, 0, (*b)->size(), 22);
    ASSERT_TRUE(first.ok() && second.ok());
    EXPECT_TRUE(first->posted());
    EXPECT_EQ(second->tag(), 22u);
    // The second message first: each lands in its own receive's buffer.
    auto s2 = p->Send(**conn, **src, 2 << 20, 2 << 20, 22);
    auto s1 = p->Send(**conn, **src, 0, 1 << 20, 21);
    ASSERT_TRUE(s1.ok() && s2.ok());
    auto got1 = d->AwaitReceive(*first, never);
    auto got2 = d->AwaitReceive(*second, never);
    ASSERT_TRUE(got1.ok()) << got1.status();
    ASSERT_TRUE(got2.ok()) << got2.status();
    EXPECT_EQ(*got1, 1 << 20);
    EXPECT_EQ(*got2, 2 << 20);
    EXPECT_FALSE(first->posted());  // spent
    EXPECT_EQ(std::string((*a)->data(), 1 << 20), bytes.substr(0, 1 << 20));
    EXPECT_EQ(std::string((*b)->data(), 2 << 20),
              bytes.substr(2 << 20, 2 << 20));
    ASSERT_TRUE(s1->Wait(absl::Seconds(10)) && s2->Wait(absl::Seconds(10)));

    // Nobody sends to it: the cancel ends it at once.
    auto unmatched = d->PostReceive(**a, 0, 4096, 23);
    ASSERT_TRUE(unmatched.ok());
    EXPECT_TRUE(d->CancelReceive(*unmatched, absl::Seconds(5)));
    EXPECT_FALSE(unmatched->posted());
    EXPECT_EQ(d->counters().ops_in_flight.load(), 0);
    // A later message with that tag waits for a new receive.
    std::memset((*a)->data(), 0, 4096);
    auto late = p->Send(**conn, **src, 0, 4096, 23);
    ASSERT_TRUE(late.ok());
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_EQ((*a)->data()[0], 0);
    auto again = d->Receive(**b, 0, 4096, 23, never);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(std::string((*b)->data(), 4096), bytes.substr(0, 4096));
    ASSERT_TRUE(late->Wait(absl::Seconds(10)));

    // Larger than the receive posted ahead: DATA_LOSS, never an overflow.
    auto small = d->PostReceive(**a, 0, 64, 24);
    ASSERT_TRUE(small.ok());
    auto big = p->Send(**conn, **src, 0, 1 << 20, 24);
    ASSERT_TRUE(big.ok());
    EXPECT_TRUE(absl::IsDataLoss(d->AwaitReceive(*small, never).status()));
    (void)big->Wait(absl::Seconds(10));
    // A spent op is refused, not waited on.
    EXPECT_FALSE(d->AwaitReceive(*small, never).ok());
    EXPECT_TRUE(d->CancelReceive(*small, absl::Seconds(1)));
  }
  EXPECT_EQ(d->counters().ops_in_flight.load(), 0);
  EXPECT_EQ(d->counters().registrations.load(), 0);
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

// UCX_TLS naming no usable transport: Create says so (and which UCX_TLS)
// instead of crashing on the way out (it once joined its thread twice).
TEST(UcxWorkerTest, UnusableTransportsAreAnError) {
  absl::StatusOr<std::unique_ptr<UcxWorker>> w;
  {
    ScopedEnv env("UCX_TLS", "no-such-transport");
    w = UcxWorker::Create();
  }
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("UCX_TLS=no-such-transport"),
            std::string::npos)
      << w.status();
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
