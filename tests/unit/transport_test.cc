// Tests of the KV wire format (chunking, coverage, checksums, header checks)
// and of the gRPC and shared-memory push transports over loopback with a
// recording sink.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

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
#include "common/transport/shm_kv_transport.h"
#include "common/transport/shm_segment.h"
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
  KvFaultInjection faults;
  faults.corrupt_chunk = 2;
  GrpcKvSender sender(grpc::InsecureChannelCredentials(), faults);
  auto result = PushAll(sender, "bad", 10, nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsDataLoss(result.status())) << result.status();
  auto rec = factory_.Get("bad");
  EXPECT_FALSE(rec.committed);
  EXPECT_TRUE(absl::IsDataLoss(rec.aborted));
  EXPECT_EQ(rec.chunks.size(), 2u);  // the two good chunks before it
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

// /dev/shm entries of KV segments created by this process.
std::vector<std::string> OurKvSegments() {
  const std::string prefix = absl::StrCat(kShmKvPrefix + 1, getpid(), "-");
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) out.push_back(e->d_name);
  }
  closedir(dir);
  return out;
}

TEST(ShmSegmentTest, CreateOpenUnlinkAndProbe) {
  auto seg = ShmSegment::Create(kShmKvPrefix, 4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(OurKvSegments().size(), 1u);
  std::memcpy((*seg)->mutable_data(), "hello", 5);
  auto ro = ShmSegment::OpenReadOnly((*seg)->name(), 4096);
  ASSERT_TRUE(ro.ok()) << ro.status();
  EXPECT_EQ(std::string((*ro)->data(), 5), "hello");
  EXPECT_EQ((*ro)->mutable_data(), nullptr);
  // The wrong size is refused; so is a name with a path in it.
  EXPECT_FALSE(ShmSegment::OpenReadOnly((*seg)->name(), 8192).ok());
  EXPECT_FALSE(ShmSegment::OpenReadOnly("/../etc", 4096).ok());
  // Unlinking keeps both mappings valid and removes the entry.
  (*ro)->Unlink();
  EXPECT_EQ(OurKvSegments().size(), 1u);  // the reader does not own it
  (*seg)->Unlink();
  EXPECT_TRUE(OurKvSegments().empty());
  EXPECT_EQ(std::string((*ro)->data(), 5), "hello");
  seg->reset();
  EXPECT_TRUE(OurKvSegments().empty());

  auto probe = ShmProbe::Create();
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_TRUE(ShmProbeMatches((*probe)->name(), (*probe)->nonce()));
  std::string wrong = (*probe)->nonce();
  wrong[0] ^= 1;
  EXPECT_FALSE(ShmProbeMatches((*probe)->name(), wrong));
  EXPECT_FALSE(ShmProbeMatches("/pdserve-probe-none", (*probe)->nonce()));
}

TEST(ShmSegmentTest, SweepRemovesOnlySegmentsOfDeadProcesses) {
  // A pid that surely exists no more: a reaped child's.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string dead = absl::StrCat(kShmKvPrefix, child, "-stale");
  const int fd = shm_open(dead.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << strerror(errno);
  close(fd);
  auto live = ShmSegment::Create(kShmKvPrefix, 64);
  ASSERT_TRUE(live.ok()) << live.status();
  // Too young for a 1 h minimum age; removed with none.
  EXPECT_EQ(SweepStaleShmSegments(absl::Hours(1)), 0);
  EXPECT_GE(SweepStaleShmSegments(absl::ZeroDuration()), 1);
  EXPECT_NE(shm_unlink(dead.c_str()), 0);  // already gone
  EXPECT_EQ(OurKvSegments().size(), 1u);   // ours (alive) was kept
}

TEST(ShmSegmentTest, DescriptorsOutsideTheSegmentAreRefused) {
  auto seg = ShmSegment::Create(kShmKvPrefix, 100);
  ASSERT_TRUE(seg.ok()) << seg.status();
  pb::KvChunkRef d;
  d.set_offset(90);
  d.set_length(10);
  EXPECT_TRUE(ChunkFromShm(**seg, d).ok());
  d.set_length(11);
  EXPECT_TRUE(absl::IsInvalidArgument(ChunkFromShm(**seg, d).status()));
  d.set_offset(-1);
  d.set_length(1);
  EXPECT_TRUE(absl::IsInvalidArgument(ChunkFromShm(**seg, d).status()));
  d.set_offset(1);
  d.set_length(std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(absl::IsInvalidArgument(ChunkFromShm(**seg, d).status()));
}

class ShmTransportTest : public GrpcTransportTest {
 protected:
  void TearDown() override {
    GrpcTransportTest::TearDown();
    EXPECT_TRUE(OurKvSegments().empty())
        << "leaked " << absl::StrJoin(OurKvSegments(), ", ");
  }
};

TEST_F(ShmTransportTest, ShmPushDeliversIdenticalChunks) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  ShmKvSender sender(&grpc, KvTransportMode::kAuto);
  auto usable = sender.ShmUsable(target_, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(usable.ok()) << usable.status();
  EXPECT_TRUE(*usable);
  std::vector<pb::KvChunk> sent;
  auto result = PushAll(sender, "shm-ok", 10, &sent);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->transport, "shm");
  const int64_t expected = TestLayout().BytesPerTokenPerLayer() * 10 * 3;
  EXPECT_EQ(result->bytes, expected);
  auto rec = factory_.Get("shm-ok");
  EXPECT_TRUE(rec.committed);
  EXPECT_EQ(rec.first_token, 42);
  ASSERT_EQ(rec.chunks.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(rec.chunks[i].data(), sent[i].data()) << i;
    EXPECT_EQ(rec.chunks[i].layer(), sent[i].layer());
    EXPECT_EQ(rec.chunks[i].token_begin(), sent[i].token_begin());
    EXPECT_EQ(rec.chunks[i].token_end(), sent[i].token_end());
    EXPECT_EQ(rec.chunks[i].xxh3(), sent[i].xxh3());
  }
  EXPECT_EQ(service_->counters().shm_pushes.load(), 1);
  EXPECT_EQ(service_->counters().bytes.load(), expected);
}

TEST_F(ShmTransportTest, SegmentsAreReusedThenUnlinkedWhenIdle) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  ShmKvSender sender(&grpc, KvTransportMode::kAuto);
  std::vector<pb::KvChunk> sent;
  // A larger push, then a smaller one that fits the same pooled segment.
  for (auto [id, tokens] : {std::pair<std::string, int>{"big", 10},
                            std::pair<std::string, int>{"small", 6}}) {
    sent.clear();
    auto result = PushAll(sender, id, tokens, &sent);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->transport, "shm");
    auto rec = factory_.Get(id);
    ASSERT_EQ(rec.chunks.size(), sent.size());
    for (size_t i = 0; i < sent.size(); ++i) {
      EXPECT_EQ(rec.chunks[i].data(), sent[i].data()) << id << " " << i;
    }
    EXPECT_EQ(sender.pooled_segments(), 1);
    EXPECT_EQ(OurKvSegments().size(), 1u);  // one segment served both
  }
  EXPECT_EQ(service_->counters().shm_pushes.load(), 2);
  // Idle pooled segments are unlinked after kPoolIdle.
  for (int i = 0; i < 500 && !OurKvSegments().empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(OurKvSegments().empty());
  EXPECT_EQ(sender.pooled_segments(), 0);
}

TEST_F(ShmTransportTest, GrpcModeNeverUsesShm) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  ShmKvSender sender(&grpc, KvTransportMode::kGrpc);
  auto result = PushAll(sender, "grpc-mode", 6, nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->transport, "grpc");
  EXPECT_EQ(service_->counters().pushes.load(), 1);
  EXPECT_EQ(service_->counters().shm_pushes.load(), 0);
}

TEST_F(ShmTransportTest, CorruptedShmBytesAreDataLoss) {
  KvFaultInjection faults;
  faults.corrupt_chunk = 2;
  GrpcKvSender grpc(grpc::InsecureChannelCredentials(), faults);
  ShmKvSender sender(&grpc, KvTransportMode::kAuto);
  auto result = PushAll(sender, "shm-bad", 10, nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsDataLoss(result.status())) << result.status();
  auto rec = factory_.Get("shm-bad");
  EXPECT_FALSE(rec.committed);
  EXPECT_TRUE(absl::IsDataLoss(rec.aborted));
  EXPECT_EQ(rec.chunks.size(), 2u);  // the two good chunks before it
  EXPECT_EQ(service_->counters().checksum_failures.load(), 1);
  EXPECT_EQ(service_->counters().shm_pushes.load(), 1);
}

TEST_F(ShmTransportTest, CancelMidPushAbortsTheSinkAndLeavesNoSegment) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  ShmKvSender sender(&grpc, KvTransportMode::kShm);
  auto stream = sender.Open(target_, Header("shm-cancel", 8),
                            absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->Send(MakeChunk(TestLayout(), 0, 0, 8, 3)).ok());
  for (int i = 0; i < 1000 && factory_.Get("shm-cancel").chunks.empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(factory_.Get("shm-cancel").chunks.size(), 1u);
  (*stream)->Cancel();
  EXPECT_TRUE(OurKvSegments().empty());  // while the stream still exists
  EXPECT_FALSE((*stream)->Commit(pb::KvCommit()).ok());
  for (int i = 0; i < 1000 && factory_.Get("shm-cancel").aborted.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(factory_.Get("shm-cancel").aborted.ok());
  EXPECT_FALSE(factory_.Get("shm-cancel").committed);
  stream->reset();
  EXPECT_TRUE(OurKvSegments().empty());
}

TEST_F(ShmTransportTest, CancelBeforeTheReceiverOpenedLeavesNoSegment) {
  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  ShmKvSender sender(&grpc, KvTransportMode::kShm);
  auto stream = sender.Open(target_, Header("shm-early", 8),
                            absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stream.ok()) << stream.status();
  (*stream)->Cancel();
  EXPECT_TRUE(OurKvSegments().empty());
}

// Another /dev/shm (other host, container or IPC namespace): the probe does
// not open here, simulated by removing it.
TEST_F(ShmTransportTest, ProbeMismatchChoosesGrpc) {
  auto stub = pb::KvTransfer::NewStub(
      grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  pb::KvDescribeResponse described;
  ASSERT_TRUE(stub->Describe(&ctx, pb::KvDescribeRequest(), &described).ok());
  ASSERT_FALSE(described.shm_probe_name().empty());
  ASSERT_EQ(shm_unlink(described.shm_probe_name().c_str()), 0);

  GrpcKvSender grpc(grpc::InsecureChannelCredentials());
  ShmKvSender sender(&grpc, KvTransportMode::kAuto);
  auto usable = sender.ShmUsable(target_, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(usable.ok());
  EXPECT_FALSE(*usable);
  std::vector<pb::KvChunk> sent;
  auto result = PushAll(sender, "no-shm", 10, &sent);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->transport, "grpc");
  EXPECT_EQ(factory_.Get("no-shm").chunks.size(), sent.size());
  EXPECT_EQ(service_->counters().shm_pushes.load(), 0);

  // --kv_transport=shm fails clearly instead.
  ShmKvSender strict(&grpc, KvTransportMode::kShm);
  auto refused = PushAll(strict, "must-shm", 4, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
}

// The probe matched but D cannot open the push's segment: nothing reached a
// sink, so the push is replayed over gRPC and succeeds.
TEST_F(ShmTransportTest, UnopenableSegmentFallsBackToGrpc) {
  KvFaultInjection faults;
  faults.unlink_shm_segment = true;
  GrpcKvSender grpc(grpc::InsecureChannelCredentials(), faults);
  ShmKvSender sender(&grpc, KvTransportMode::kAuto);
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
  EXPECT_EQ(service_->counters().shm_unusable.load(), 1);
  EXPECT_EQ(service_->counters().shm_pushes.load(), 0);
  EXPECT_EQ(service_->counters().pushes.load(), 1);

  // Without fallback (--kv_transport=shm) the same refusal fails the push.
  ShmKvSender strict(&grpc, KvTransportMode::kShm);
  auto refused = PushAll(strict, "strict", 4, nullptr);
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(factory_.Get("strict").chunks.empty());
}

}  // namespace
}  // namespace pdserve::transport
