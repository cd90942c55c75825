// Paged KV pool: budget -> blocks, all-or-nothing reservation, explicit and
// idempotent free, export/import of the wire layout with range checks.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/kv/kv_cache.h"
#include "common/util/checksum.h"
#include "common/util/huge_pages.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

KvLayout Layout(DType dtype) {
  KvLayout l;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_dim = 4;
  l.block_size = 4;
  l.dtype = dtype;
  return l;
}

TEST(KvCache, BudgetBoundsTheBlockCount) {
  const KvLayout l = Layout(DType::kBF16);
  EXPECT_EQ(l.BytesPerTokenPerLayer(), 2 * 2 * 4 * 2);
  EXPECT_EQ(l.BytesPerBlock(), 32 * 4 * 3);
  auto kv = KvCache::Create(l, l.BytesPerBlock() * 10 + 5);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ((*kv)->total_blocks(), 10);
  EXPECT_FALSE(KvCache::Create(l, l.BytesPerBlock() - 1).ok());
}

TEST(KvCache, ReserveIsAllOrNothingAndFreeIsIdempotent) {
  const KvLayout l = Layout(DType::kF32);
  auto kv = std::move(*KvCache::Create(l, l.BytesPerBlock() * 5));
  SeqId a = kv->CreateSequence(), b = kv->CreateSequence();
  ASSERT_TRUE(kv->Reserve(a, 9).ok());  // 3 blocks
  EXPECT_EQ(kv->Capacity(a), 12);
  EXPECT_EQ(kv->free_blocks(), 2);
  EXPECT_EQ(kv->Reserve(b, 13).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv->free_blocks(), 2);  // nothing taken
  EXPECT_EQ(kv->Capacity(b), 0);
  ASSERT_TRUE(kv->Reserve(b, 8).ok());
  EXPECT_EQ(kv->free_blocks(), 0);
  kv->Free(a);
  kv->Free(a);
  EXPECT_EQ(kv->free_blocks(), 3);
  EXPECT_EQ(kv->Length(a), -1);
  EXPECT_FALSE(kv->SetLength(b, 9).ok());  // beyond capacity 8
}

TEST(KvCache, ExportImportRoundTripsAcrossPoolsWithOtherBlockSizes) {
  KvLayout la = Layout(DType::kBF16), lb = la;
  lb.block_size = 3;
  auto a = std::move(*KvCache::Create(la, la.BytesPerBlock() * 8));
  auto b = std::move(*KvCache::Create(lb, lb.BytesPerBlock() * 8));
  SeqId sa = a->CreateSequence(), sb = b->CreateSequence();
  ASSERT_TRUE(a->Reserve(sa, 10).ok());
  ASSERT_TRUE(b->Reserve(sb, 10).ok());
  const int64_t row = a->row_bytes();
  auto key_row = [&](int layer, int pos) {
    std::string r(row, '\0');
    for (int64_t i = 0; i < row; ++i) {
      r[i] = static_cast<char>(layer * 50 + pos * 3 + i);
    }
    return r;
  };
  auto value_row = [&](int layer, int pos) {
    std::string r(row, '\0');
    for (int64_t i = 0; i < row; ++i) {
      r[i] = static_cast<char>(-layer * 50 - pos - i);
    }
    return r;
  };
  for (int layer = 0; layer < 3; ++layer) {
    for (int pos = 0; pos < 10; ++pos) {
      a->WriteRow(sa, layer, 0, pos, key_row(layer, pos).data());
      a->WriteRow(sa, layer, 1, pos, value_row(layer, pos).data());
    }
  }
  ASSERT_TRUE(a->SetLength(sa, 10).ok());
  std::string bytes;
  EXPECT_FALSE(a->ExportLayer(sa, 0, 0, 11, &bytes).ok());  // past length
  EXPECT_FALSE(a->ExportLayer(sa, 3, 0, 10, &bytes).ok());  // no layer 3
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_TRUE(a->ExportLayer(sa, layer, 0, 10, &bytes).ok());
    ASSERT_EQ(static_cast<int64_t>(bytes.size()),
              10 * la.BytesPerTokenPerLayer());
    // K rows first, then V rows, token-major whatever the pool's layout.
    for (int pos = 0; pos < 10; ++pos) {
      EXPECT_EQ(bytes.substr(pos * row, row), key_row(layer, pos));
      EXPECT_EQ(bytes.substr((10 + pos) * row, row), value_row(layer, pos));
    }
    EXPECT_FALSE(b->ImportLayer(sb, layer, 0, 10, bytes.substr(1)).ok());
    ASSERT_TRUE(b->ImportLayer(sb, layer, 0, 10, bytes).ok());
  }
  ASSERT_TRUE(b->SetLength(sb, 10).ok());
  for (int layer = 0; layer < 3; ++layer) {
    std::string ea, eb;
    ASSERT_TRUE(a->ExportLayer(sa, layer, 2, 9, &ea).ok());
    ASSERT_TRUE(b->ExportLayer(sb, layer, 2, 9, &eb).ok());
    EXPECT_EQ(ea, eb);
  }
}

// The in-pool layout the attention kernels read: per block, layer and kv
// head, K transposed ([head_dim][block_size]) and V [block_size][head_dim].
TEST(KvCache, TilesHoldKeysTransposedAndValuesByRow) {
  KvLayout l = Layout(DType::kF32);
  l.block_size = 5;
  auto kv = std::move(*KvCache::Create(l, l.BytesPerBlock() * 4));
  SeqId s = kv->CreateSequence();
  ASSERT_TRUE(kv->Reserve(s, 12).ok());
  const int kvd = l.num_kv_heads * l.head_dim;
  auto value = [](int layer, int kv_index, int pos, int i) {
    return static_cast<float>(1000 * layer + 100 * kv_index + 10 * pos + i);
  };
  for (int layer = 0; layer < 3; ++layer) {
    for (int which = 0; which < 2; ++which) {
      for (int pos = 0; pos < 12; ++pos) {
        std::vector<float> row(kvd);
        for (int i = 0; i < kvd; ++i) row[i] = value(layer, which, pos, i);
        kv->WriteRow(s, layer, which, pos,
                     reinterpret_cast<const char*>(row.data()));
        std::vector<float> back(kvd);
        kv->ReadRow(s, layer, which, pos, reinterpret_cast<char*>(back.data()));
        EXPECT_EQ(back, row);
      }
    }
  }
  const std::vector<int32_t>& table = *kv->BlockTable(s);
  for (int layer = 0; layer < 3; ++layer) {
    for (int h = 0; h < l.num_kv_heads; ++h) {
      for (int pos = 0; pos < 12; ++pos) {
        const int32_t block = table[pos / l.block_size];
        const int off = pos % l.block_size;
        const float* k =
            reinterpret_cast<const float*>(kv->KeyTile(block, layer, h));
        const float* v =
            reinterpret_cast<const float*>(kv->ValueTile(block, layer, h));
        for (int d = 0; d < l.head_dim; ++d) {
          const int i = h * l.head_dim + d;
          EXPECT_EQ(k[d * l.block_size + off], value(layer, 0, pos, i));
          EXPECT_EQ(v[off * l.head_dim + d], value(layer, 1, pos, i));
        }
      }
    }
  }
}

// Export and import move whole blocks of 16 tokens with 16 x 16 transposes
// (AVX-512; 8 x 8 on AVX2; imports with ordinary or non-temporal stores) and
// partial blocks one element at a time: all of them, for every block size and
// head size, must put each element where the in-pool layout says (checked by
// indexing the tiles directly) and give back the same bytes.
TEST(KvCache, ExportImportPlaceEveryElementForAnyBlockAndRange) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int block_size : {16, 5, 1, 32}) {
      for (int head_dim : {64, 32, 16, 8}) {
        KvLayout l;
        l.num_layers = 2;
        l.num_kv_heads = 3;
        l.head_dim = head_dim;
        l.block_size = block_size;
        l.dtype = dtype;
        const int capacity = 70;
        auto kv = std::move(*KvCache::Create(
            l, l.BytesPerBlock() * (capacity / block_size + 2)));
        const kv_internal::TileGeometry g = kv->Geometry();
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " block " << block_size
                     << " head_dim " << head_dim << " fast "
                     << kv_internal::TileCopyVectorized(g));
        SeqId s = kv->CreateSequence();
        ASSERT_TRUE(kv->Reserve(s, capacity).ok());
        ASSERT_TRUE(kv->SetLength(s, capacity).ok());
        const int es = static_cast<int>(DTypeSize(dtype));
        const int64_t row = kv->row_bytes();
        const std::vector<int32_t>& table = *kv->BlockTable(s);
        // What every position of each layer should hold: [layer][kv][pos],
        // one wire row each (imports of partial blocks must leave the
        // block's other positions alone).
        std::vector<std::string> expect[2][2];
        for (auto& layer_rows : expect) {
          for (auto& rows : layer_rows) {
            rows.assign(capacity, std::string(row, '\0'));
          }
        }
        for (auto [begin, end] : std::vector<std::pair<int, int>>{{0, capacity},
                                                                  {0, capacity},
                                                                  {3, 37},
                                                                  {16, 48},
                                                                  {31, 33},
                                                                  {69, 70},
                                                                  {5, 14},
                                                                  {33, 35}}) {
          const int layer = static_cast<int>(rng() % 2);
          const int64_t n = end - begin;
          std::string wire(2 * n * row, '\0');
          for (char& c : wire) c = static_cast<char>(rng());
          // Every other import hashes its bytes on the way; every other
          // one writes the pool with non-temporal stores (what ImportLayer
          // does for large chunks), K and V through WriteRowsAt.
          uint64_t imported_xxh3 = 0;
          const bool hash_import = rng() % 2 == 0;
          const Stores stores =
              rng() % 2 == 0 ? Stores::kCached : Stores::kStreaming;
          SCOPED_TRACE(stores == Stores::kStreaming ? "streaming" : "cached");
          if (stores == Stores::kCached) {
            ASSERT_TRUE(kv->ImportLayer(s, layer, begin, end, wire,
                                        hash_import ? &imported_xxh3 : nullptr)
                            .ok());
          } else {
            Xxh3Stream hash;
            for (int which = 0; which < 2; ++which) {
              kv->WriteRowsAt(table, layer, which, begin, static_cast<int>(n),
                              wire.data() + which * n * row,
                              hash_import ? &hash : nullptr, stores);
            }
            imported_xxh3 = hash.Digest();
          }
          if (hash_import) {
            EXPECT_EQ(imported_xxh3, Xxh3(wire.data(), wire.size()));
          }
          for (int which = 0; which < 2; ++which) {
            for (int pos = begin; pos < end; ++pos) {
              expect[layer][which][pos] =
                  wire.substr(which * n * row + (pos - begin) * row, row);
            }
          }
          for (int which = 0; which < 2; ++which) {
            for (int pos = 0; pos < capacity; ++pos) {
              const int32_t block = table[pos / block_size];
              const int off = pos % block_size;
              for (int h = 0; h < l.num_kv_heads; ++h) {
                const char* tile = which == 0 ? kv->KeyTile(block, layer, h)
                                              : kv->ValueTile(block, layer, h);
                for (int d = 0; d < head_dim; ++d) {
                  const int64_t at = which == 0 ? int64_t{d} * block_size + off
                                                : int64_t{off} * head_dim + d;
                  const char* want = expect[layer][which][pos].data() +
                                     (int64_t{h} * head_dim + d) * es;
                  ASSERT_EQ(std::memcmp(tile + at * es, want, es), 0)
                      << "after [" << begin << ", " << end << "): kv " << which
                      << " pos " << pos << " head " << h << " dim " << d;
                }
              }
            }
          }
          std::string back;
          ASSERT_TRUE(kv->ExportLayer(s, layer, begin, end, &back).ok());
          EXPECT_EQ(back, wire) << "[" << begin << ", " << end << ")";
          // Hashing on the way changes no byte and gives the bytes' XXH3.
          std::string hashed;
          uint64_t exported_xxh3 = 0;
          ASSERT_TRUE(
              kv->ExportLayer(s, layer, begin, end, &hashed, &exported_xxh3)
                  .ok());
          EXPECT_EQ(hashed, wire);
          EXPECT_EQ(exported_xxh3, Xxh3(wire.data(), wire.size()));
          // Non-temporal stores (staged per block) write the same bytes and
          // hash, into memory at any offset from a cache line.
          const int shift = static_cast<int>(rng() % 64);
          std::string streamed(wire.size() + shift, '\x5a');
          uint64_t streamed_xxh3 = 0;
          ASSERT_TRUE(kv->ExportLayer(s, layer, begin, end,
                                      absl::MakeSpan(streamed.data() + shift,
                                                     wire.size()),
                                      &streamed_xxh3, Stores::kStreaming)
                          .ok());
          EXPECT_EQ(streamed.substr(shift), wire) << "shift " << shift;
          EXPECT_EQ(streamed.substr(0, shift), std::string(shift, '\x5a'));
          EXPECT_EQ(streamed_xxh3, exported_xxh3);
        }
      }
    }
  }
}

// From /proc/self/smaps: the "THPeligible:" value of the mapping holding
// `p` (-1 if absent), the "Rss:" of the mappings overlapping [p, p + bytes)
// (madvise splits a pool's mapping where its whole 2 MiB pages end), and
// how many mappings there are.
struct Mappings {
  int thp_eligible = -1;
  int64_t rss_kb = 0;
  int count = 0;
};
Mappings SmapsAt(const void* p, int64_t bytes = 1) {
  Mappings m;
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  bool holds = false, overlaps = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 &&
        line.find('-') < line.find(' ')) {
      ++m.count;
      holds = lo <= at && at < hi;
      overlaps = lo < at + bytes && at < hi;
    } else if (holds && line.rfind("THPeligible:", 0) == 0) {
      m.thp_eligible = std::atoi(line.c_str() + 12);
    } else if (overlaps && line.rfind("Rss:", 0) == 0) {
      m.rss_kb += std::atoll(line.c_str() + 4);
    }
  }
  return m;
}

// The pool starts on a 2 MiB boundary, asks for huge pages and is resident
// at once (unless PDSERVE_HUGE_PAGES=0, the kv_test_no_huge_pages variant:
// resident only when written); pools of any size map and unmap without
// leaving mappings behind.
TEST(KvCache, PoolSitsOnHugePagesAndUnmapsCleanly) {
  KvLayout l = Layout(DType::kBF16);
  l.num_kv_heads = 3;  // a block of 288 bytes: pools end mid-page
  const int before = SmapsAt(nullptr).count;
  for (int64_t blocks : {1, 7, 15000, 40000}) {
    auto kv = std::move(*KvCache::Create(l, l.BytesPerBlock() * blocks));
    char* const base = kv->KeyTile(0, 0, 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % kHugePageBytes, 0u) << blocks;
    const int64_t bytes = l.BytesPerBlock() * blocks;
    // On huge pages the pool is resident from the start; on 4 KiB pages
    // nothing is before the first write.
    const int64_t rss_kb = SmapsAt(base, bytes).rss_kb;
    if (HugePagesWanted() && KernelHasHugePages()) {
      EXPECT_GE(rss_kb * 1024, bytes / 4096 * 4096) << blocks;
    } else {
      EXPECT_EQ(rss_kb, 0) << blocks;
    }
    // Every byte of the pool is writable, the last one included.
    std::memset(base, 1, bytes);
    EXPECT_EQ(base[bytes - 1], 1);
    const Mappings m = SmapsAt(base);
    if (bytes >= kHugePageBytes && m.thp_eligible >= 0 &&
        KernelHasHugePages()) {
      EXPECT_EQ(m.thp_eligible, HugePagesWanted() ? 1 : 0) << blocks;
    }
  }
  EXPECT_EQ(SmapsAt(nullptr).count, before);
}

TEST(HugePages, StreamingBuffersAreAlignedAndAdvised) {
  for (int64_t bytes :
       {int64_t{1}, int64_t{100}, int64_t{3} << 20, (int64_t{5} << 20) + 17}) {
    char* const p = static_cast<char*>(AllocateForStreaming(bytes));
    ASSERT_NE(p, nullptr);
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(at % 64, 0u);
    std::memset(p, 7, bytes);
    if (bytes >= kHugePageBytes && HugePagesWanted()) {
      EXPECT_EQ(at % kHugePageBytes, 0u);
      const Mappings m = SmapsAt(p);
      if (m.thp_eligible >= 0 && KernelHasHugePages()) {
        EXPECT_EQ(m.thp_eligible, 1) << bytes;
      }
    }
    std::free(p);
  }
}

}  // namespace
}  // namespace pdserve
