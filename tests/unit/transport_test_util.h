// Helpers of the transport tests: test chunks, a sink factory that records
// what pushes delivered, and a fixture serving a KvTransferService on a
// loopback port. Header-only, for tests/unit/*transport_test.cc.
#ifndef PDSERVE_TESTS_UNIT_TRANSPORT_TEST_UTIL_H_
#define PDSERVE_TESTS_UNIT_TRANSPORT_TEST_UTIL_H_

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/transport/grpc_kv_transport.h"
#include "common/transport/kv_wire.h"
#include "common/util/streaming_copy.h"
#include "gtest/gtest.h"

namespace pdserve::transport {

inline KvLayout TestLayout() {
  KvLayout l;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_dim = 4;
  l.block_size = 16;
  l.dtype = DType::kF32;
  return l;
}

inline std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

inline pb::KvChunk MakeChunk(const KvLayout& l, int layer, int b, int e,
                             uint32_t seed) {
  pb::KvChunk c;
  c.set_layer(layer);
  c.set_token_begin(b);
  c.set_token_end(e);
  c.set_data(RandomBytes(l.BytesPerTokenPerLayer() * (e - b), seed));
  SealChunk(&c);
  return c;
}

// Records what a push delivered.
class RecordingFactory : public KvSinkFactory {
 public:
  struct Record {
    std::vector<pb::KvChunk> chunks;
    bool committed = false;
    absl::Status aborted;
    int32_t first_token = -1;
  };
  class Sink : public KvSink {
   public:
    Sink(RecordingFactory* f, std::string id) : f_(f), id_(std::move(id)) {}
    absl::Status OnChunk(const KvChunkView& chunk, uint64_t* xxh3) override {
      if (f_->before_chunk_) f_->before_chunk_(id_);
      if (xxh3 != nullptr) *xxh3 = KvChecksum(chunk.data);
      pb::KvChunk copy;
      copy.set_layer(chunk.layer);
      copy.set_token_begin(chunk.token_begin);
      copy.set_token_end(chunk.token_end);
      copy.set_data(std::string(chunk.data));
      copy.set_xxh3(chunk.xxh3);
      absl::MutexLock lock(&f_->mu_);
      f_->records_[id_].chunks.push_back(std::move(copy));
      return absl::OkStatus();
    }
    absl::Status OnCommit(const pb::KvCommit& commit, double) override {
      absl::MutexLock lock(&f_->mu_);
      f_->records_[id_].committed = true;
      f_->records_[id_].first_token = commit.first_token().id();
      return absl::OkStatus();
    }
    void OnAbort(const absl::Status& status) override {
      absl::MutexLock lock(&f_->mu_);
      f_->records_[id_].aborted = status;
    }

    bool HashesChunks() const override { return f_->hashes_chunks_; }

   private:
    RecordingFactory* f_;
    std::string id_;
  };

  absl::StatusOr<std::unique_ptr<KvSink>> Begin(
      const pb::KvHeader& header, std::function<void()> cancel) override {
    if (refuse_) return absl::ResourceExhaustedError("no room");
    return std::make_unique<Sink>(this, header.request_id());
  }
  const std::string& fingerprint() const override { return fingerprint_; }
  KvLayout layout() const override { return TestLayout(); }

  Record Get(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return records_[id];
  }

  bool refuse_ = false;
  // Whether the sinks hash chunks themselves (the service then skips its
  // own pass and compares after OnChunk), as the decode worker's do.
  bool hashes_chunks_ = false;
  // Called with the push's request id as a sink's OnChunk begins, before it
  // reads the bytes (set before the pushes it should see).
  std::function<void(const std::string&)> before_chunk_;

 private:
  std::string fingerprint_ = "model-a";
  absl::Mutex mu_;
  std::map<std::string, Record> records_ ABSL_GUARDED_BY(mu_);
};

// A KvTransferService with a recording sink on a loopback port, and pushes
// of test chunks to it.
class GrpcTransportTest : public ::testing::Test {
 protected:
  // What the service accepts (UCX tests add their receiver).
  virtual KvReceiveOptions ReceiveOptions() { return {}; }
  void SetUp() override {
    service_ = std::make_unique<KvTransferService>(&factory_, ReceiveOptions());
    ServerOptions opts;
    opts.address = "127.0.0.1:0";
    opts.services = {service_.get()};
    auto started = StartServer(opts);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    target_ = "127.0.0.1:" + std::to_string(started->port);
  }
  void TearDown() override { server_->Shutdown(); }

  pb::KvHeader Header(const std::string& id, int tokens,
                      const std::string& fp = "model-a") {
    pb::KvHeader h;
    h.set_request_id(id);
    h.set_model_fingerprint(fp);
    *h.mutable_layout() = LayoutToProto(TestLayout());
    h.set_num_tokens(tokens);
    return h;
  }

  // Pushes all layers of `tokens` tokens in chunks of up to 4 tokens;
  // `in_place`: each chunk's bytes written into the sender's NewChunkBuffer
  // (SendBuffer), as the prefill worker exports them; with `every_other`,
  // every other chunk only (the rest handed over as strings).
  absl::StatusOr<KvPushResult> PushAll(KvSender& sender, const std::string& id,
                                       int tokens,
                                       std::vector<pb::KvChunk>* sent,
                                       const std::string& fp = "model-a",
                                       bool in_place = false,
                                       bool every_other = false) {
    auto stream = sender.Open(target_, Header(id, tokens, fp),
                              absl::Now() + absl::Seconds(10));
    if (!stream.ok()) return stream.status();
    const KvLayout l = TestLayout();
    uint32_t seed = 1;
    for (int layer = 0; layer < l.num_layers; ++layer) {
      for (auto [b, e] : ChunkTokenRanges(0, tokens, l.BytesPerTokenPerLayer(),
                                          l.BytesPerTokenPerLayer() * 4)) {
        pb::KvChunk c = MakeChunk(l, layer, b, e, seed++);
        if (sent != nullptr) sent->push_back(c);
        absl::Status s;
        if (in_place && (!every_other || seed % 2 == 0)) {
          std::unique_ptr<KvChunkBuffer> bytes = sender.NewChunkBuffer(
              target_, static_cast<int64_t>(c.data().size()));
          // As the prefill worker's export fills it: the way the buffer
          // asks for.
          s = bytes->Fill([&](Stores stores) {
            if (stores == Stores::kStreaming) {
              StreamingCopy(bytes->data(), c.data().data(), c.data().size());
            } else {
              std::memcpy(bytes->data(), c.data().data(), c.data().size());
            }
            return absl::OkStatus();
          });
          if (!s.ok()) return s;
          c.clear_data();
          s = (*stream)->SendBuffer(std::move(c), std::move(bytes));
        } else {
          s = (*stream)->Send(std::move(c));
        }
        if (!s.ok()) return s;
      }
    }
    pb::KvCommit commit;
    commit.mutable_first_token()->set_id(42);
    return (*stream)->Commit(commit);
  }

  // Pushes `id` over gRPC with its third chunk corrupted after sealing:
  // DATA_LOSS, no commit, and the sink saw `seen` chunks.
  void ExpectCorruptThirdChunkIsDataLoss(const std::string& id, size_t seen) {
    KvFaultInjection faults;
    faults.corrupt_chunk = 2;
    GrpcKvSender sender(grpc::InsecureChannelCredentials(), faults);
    auto result = PushAll(sender, id, 10, nullptr);
    ASSERT_FALSE(result.ok());
    EXPECT_TRUE(absl::IsDataLoss(result.status())) << result.status();
    auto rec = factory_.Get(id);
    EXPECT_FALSE(rec.committed);
    EXPECT_TRUE(absl::IsDataLoss(rec.aborted));
    EXPECT_EQ(rec.chunks.size(), seen);
  }

  RecordingFactory factory_;
  std::unique_ptr<KvTransferService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

}  // namespace pdserve::transport

#endif  // PDSERVE_TESTS_UNIT_TRANSPORT_TEST_UTIL_H_
