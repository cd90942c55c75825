// Tests of the KV wire format (chunking, coverage, checksums, header checks)
// and of the gRPC push transport over loopback with a recording sink (UCX:
// ucx_transport_test.cc).
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util/grpc_util.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_wire.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/unit/transport_test_util.h"

namespace pdserve::transport {
namespace {

TEST(KvWireTest, ChunkRangesCoverExactlyAndRespectTarget) {
  auto ranges = ChunkTokenRanges(0, 100, 64, 640);  // 10 tokens per chunk
  ASSERT_EQ(ranges.size(), 10u);
  int next = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, next);
    EXPECT_LE((e - b) * 64, 640);
    next = e;
  }
  EXPECT_EQ(next, 100);
  // A token bigger than the target still makes progress (1 per chunk).
  EXPECT_EQ(ChunkTokenRanges(5, 8, 1000, 10).size(), 3u);
  EXPECT_TRUE(ChunkTokenRanges(3, 3, 8, 8).empty());
}

TEST(KvWireTest, CoverageAcceptsInOrderAndCompletes) {
  const KvLayout l = TestLayout();
  EXPECT_EQ(l.BytesPerTokenPerLayer(), 2 * 2 * 4 * 4);
  KvCoverage cov(l, 10);
  EXPECT_EQ(cov.expected_bytes(), l.BytesPerTokenPerLayer() * 10 * 3);
  for (int layer = 0; layer < 3; ++layer) {
    EXPECT_FALSE(cov.complete());
    ASSERT_TRUE(cov.Accept(MakeChunk(l, layer, 0, 4, layer)).ok());
    ASSERT_TRUE(cov.Accept(MakeChunk(l, layer, 4, 10, layer + 7)).ok());
  }
  EXPECT_TRUE(cov.complete());
  EXPECT_EQ(cov.bytes(), cov.expected_bytes());
}

TEST(KvWireTest, CoverageRejectsBadChunks) {
  const KvLayout l = TestLayout();
  KvCoverage cov(l, 10);
  // Gap.
  EXPECT_TRUE(absl::IsInvalidArgument(cov.Accept(MakeChunk(l, 0, 2, 4, 1))));
  // Bad layer.
  EXPECT_TRUE(absl::IsInvalidArgument(cov.Accept(MakeChunk(l, 3, 0, 4, 1))));
  // Beyond the token count.
  EXPECT_TRUE(absl::IsInvalidArgument(cov.Accept(MakeChunk(l, 0, 0, 11, 1))));
  // Wrong size.
  pb::KvChunk short_chunk = MakeChunk(l, 0, 0, 4, 1);
  short_chunk.mutable_data()->pop_back();
  SealChunk(&short_chunk);
  EXPECT_TRUE(absl::IsInvalidArgument(cov.Accept(short_chunk)));
  // One flipped byte: DATA_LOSS, and the chunk is not recorded.
  pb::KvChunk corrupt = MakeChunk(l, 0, 0, 4, 1);
  (*corrupt.mutable_data())[5] ^= 1;
  EXPECT_TRUE(absl::IsDataLoss(cov.Accept(corrupt)));
  EXPECT_EQ(cov.bytes(), 0);
  EXPECT_TRUE(cov.Accept(MakeChunk(l, 0, 0, 4, 1)).ok());
}

TEST(KvWireTest, ChecksumIsXxh3OfTheBytes) {
  EXPECT_EQ(KvChecksum(""), 0x2D06800538D394C2ull);  // XXH3_64bits("")
  EXPECT_NE(KvChecksum("a"), KvChecksum("b"));
}

TEST(KvWireTest, HeaderChecks) {
  const KvLayout l = TestLayout();
  pb::KvHeader h;
  h.set_request_id("r1");
  h.set_model_fingerprint("abc");
  *h.mutable_layout() = LayoutToProto(l);
  h.set_num_tokens(5);
  EXPECT_TRUE(CheckHeaderCompatible(h, "abc", l).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckHeaderCompatible(h, "xyz", l)));
  KvLayout other = l;
  other.num_kv_heads = 8;
  EXPECT_TRUE(
      absl::IsFailedPrecondition(CheckHeaderCompatible(h, "abc", other)));
  h.mutable_layout()->set_dtype("int3");
  EXPECT_TRUE(absl::IsInvalidArgument(CheckHeaderCompatible(h, "abc", l)));
  auto round = LayoutFromProto(LayoutToProto(l));
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->num_layers, 3);
  EXPECT_EQ(round->dtype, DType::kF32);
}

TEST(GrpcUtilTest, StatusMappingKeepsCodeAndMessage) {
  absl::Status s = absl::DataLossError("bad chunk");
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(g.error_message(), "bad chunk");
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::UNAVAILABLE), "UNAVAILABLE");
}

TEST_F(GrpcTransportTest, PushDeliversEveryByte) {
  GrpcKvSender sender(grpc::InsecureChannelCredentials());
  std::vector<pb::KvChunk> sent;
  auto result = PushAll(sender, "ok", 10, &sent);
  ASSERT_TRUE(result.ok()) << result.status();
  const int64_t expected = TestLayout().BytesPerTokenPerLayer() * 10 * 3;
  EXPECT_EQ(result->bytes, expected);
  auto rec = factory_.Get("ok");
  EXPECT_TRUE(rec.committed);
  EXPECT_EQ(rec.first_token, 42);
  ASSERT_EQ(rec.chunks.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(rec.chunks[i].data(), sent[i].data());
    EXPECT_EQ(rec.chunks[i].layer(), sent[i].layer());
  }
  EXPECT_EQ(service_->counters().bytes.load(), expected);
}

TEST_F(GrpcTransportTest, CorruptedChunkIsDataLoss) {
  ExpectCorruptThirdChunkIsDataLoss("bad", 2);  // the two good ones before it
  EXPECT_EQ(service_->counters().checksum_failures.load(), 1);
}

// A sink that hashes the chunks itself (the decode worker's import): the
// service skips its own pass, compares right after each OnChunk, and fails
// the push on a mismatch before its commit, so nothing of it counts.
TEST_F(GrpcTransportTest, SinkHashingChunksIsVerifiedToo) {
  factory_.hashes_chunks_ = true;
  GrpcKvSender good(grpc::InsecureChannelCredentials());
  ASSERT_TRUE(PushAll(good, "ok", 10, nullptr).ok());
  EXPECT_TRUE(factory_.Get("ok").committed);

  // The sink saw the bad chunk (it hashed it), and nothing after it.
  ExpectCorruptThirdChunkIsDataLoss("bad", 3);
  EXPECT_EQ(service_->counters().checksum_failures.load(), 1);
}

TEST_F(GrpcTransportTest, OtherModelIsRefused) {
  GrpcKvSender sender(grpc::InsecureChannelCredentials());
  auto result = PushAll(sender, "other", 4, nullptr, "model-b");
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
  EXPECT_TRUE(factory_.Get("other").chunks.empty());
}

TEST_F(GrpcTransportTest, FullReceiverIsResourceExhausted) {
  factory_.refuse_ = true;
  GrpcKvSender sender(grpc::InsecureChannelCredentials());
  auto result = PushAll(sender, "full", 4, nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(result.status())) << result.status();
}

TEST_F(GrpcTransportTest, CancelledPushAbortsTheSink) {
  GrpcKvSender sender(grpc::InsecureChannelCredentials());
  auto stream = sender.Open(target_, Header("cancel", 8),
                            absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Send(MakeChunk(TestLayout(), 0, 0, 8, 3)).ok());
  // Cancel only once the receiver holds a sink with data in it: a cancel that
  // races ahead of the call reaching the server allocates nothing to abort.
  for (int i = 0; i < 1000 && factory_.Get("cancel").chunks.empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(factory_.Get("cancel").chunks.size(), 1u);
  (*stream)->Cancel();
  pb::KvCommit commit;
  EXPECT_FALSE((*stream)->Commit(commit).ok());
  // The receiver sees the broken stream and aborts the sink (waits up to
  // 10 s: on a loaded 2-core machine the server may notice late).
  for (int i = 0; i < 1000 && factory_.Get("cancel").aborted.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(factory_.Get("cancel").aborted.ok());
  EXPECT_FALSE(factory_.Get("cancel").committed);
}

}  // namespace
}  // namespace pdserve::transport
