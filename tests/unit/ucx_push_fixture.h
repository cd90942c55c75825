// The fixture of the UCX push tests (ucx_push_test.cc, ucx_in_place_test.cc):
// a receiving service that accepts UCX pushes and a UCX sender, P and D in
// this process with a UCX worker each.
#ifndef PDSERVE_TESTS_UNIT_UCX_PUSH_FIXTURE_H_
#define PDSERVE_TESTS_UNIT_UCX_PUSH_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/ucx_kv_receiver.h"
#include "common/transport/ucx_kv_sender.h"
#include "common/transport/ucx_worker.h"
#include "gtest/gtest.h"
#include "tests/unit/transport_test_util.h"
#include "tests/unit/ucx_test_util.h"

namespace pdserve::transport {

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

  // The sender's idle regions are unregistered (within 10 s): P holds no
  // UCX memory.
  void ExpectPoolEmptiesWithin10s(UcxKvSender& sender) {
    for (int i = 0; i < 500 && p_worker_->counters().registrations.load() > 0;
         ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(p_worker_->counters().registrations.load(), 0);
    EXPECT_EQ(sender.pooled_regions(), 0);
  }

  std::unique_ptr<UcxWorker> p_worker_, d_worker_;
  std::unique_ptr<UcxKvReceiver> receiver_;
};

}  // namespace pdserve::transport

#endif  // PDSERVE_TESTS_UNIT_UCX_PUSH_FIXTURE_H_
