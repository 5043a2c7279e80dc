#include "allocator/region_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/allocator/region_test_support.h"
#include "tests/testing/scoped_test_logging.h"

namespace tpushim {

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr uint64_t kMiB = uint64_t{1} << 20;

using testutil::ExpectConsistent;
using testutil::ScopedTestLogging;
using testutil::TestRegion;

TEST(RegionAllocatorTest, FailsWithLibtpuMessageWhenFull) {
  ScopedTestLogging logs;  // fails allocations on purpose: ERRORs off stderr
  TestRegion region(16 * kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  // Leave 6584 KiB free: libtpu prints that as "6.43M".
  const uint64_t free_target = 6584 * 1024;
  ASSERT_TRUE(allocator.Allocate(region.size() - free_target).ok());
  absl::StatusOr<void*> p = allocator.Allocate(8 * kMiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()),
              StartsWith("Attempting to allocate 8.00M. That was not "
                         "possible. There are 6.43M free."));
  EXPECT_EQ(allocator.GetStats().failures, 1u);
  ExpectConsistent(allocator);
}

TEST(RegionAllocatorTest, LogsTheFailureAtErrorExactlyAsLibtpu) {
  ScopedTestLogging logs;
  TestRegion region(16 * kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  ASSERT_TRUE(allocator.Allocate(region.size() - 6584 * 1024).ok());
  ASSERT_FALSE(allocator.Allocate(8 * kMiB).ok());
  const std::string errors = logs.File("ERROR");
  EXPECT_THAT(errors,
              HasSubstr("] Allocating buffer from premapped region failed "
                        "with: RESOURCE_EXHAUSTED: Attempting to allocate "
                        "8.00M. That was not possible. There are 6.43M "
                        "free."));
  EXPECT_THAT(logs.File("INFO"), Not(HasSubstr("Premapped region dump")));
}

TEST(RegionAllocatorTest, DumpOnOomLogsTheAllocatorState) {
  ScopedTestLogging logs;
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(),
                            {.dump_on_oom = true});
  ASSERT_TRUE(allocator.Allocate(kMiB / 2).ok());
  ASSERT_FALSE(allocator.Allocate(kMiB).ok());
  const std::string info = logs.File("INFO");
  EXPECT_THAT(info, HasSubstr("Premapped region dump: 1.00M"));
  EXPECT_THAT(info, HasSubstr("largest free blocks: 512.0K"));
  EXPECT_THAT(info, HasSubstr(std::string(50, '#') + std::string(50, '.')));
}

TEST(RegionAllocatorTest, OutOfMemoryDetailsFollowTheLibtpuText) {
  ScopedTestLogging logs;  // fails allocations on purpose: ERRORs off stderr
  TestRegion region(4 * kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  ASSERT_TRUE(allocator.Allocate(3 * kMiB).ok());
  absl::StatusOr<void*> p = allocator.Allocate(2 * kMiB);
  ASSERT_FALSE(p.ok());
  const std::string message(p.status().message());
  EXPECT_THAT(message, HasSubstr("There are 1.00M free. Largest free block: "
                                 "1.00M (fragmentation 0.0%)"));
  EXPECT_THAT(message, HasSubstr("region size 4.00M "
                                 "(TPU_PREMAPPED_BUFFER_SIZE=4194304)"));
  EXPECT_THAT(message, HasSubstr("threshold 4194304 bytes"));
  EXPECT_THAT(message, HasSubstr("1 live allocations"));
  // The hint names a size larger than the one in force.
  EXPECT_THAT(message, HasSubstr("TPU_PREMAPPED_BUFFER_SIZE would have to be "
                                 "at least 5242880 (it is 4194304)"));
}

TEST(RegionAllocatorTest, FragmentedFailureSaysSo) {
  ScopedTestLogging logs;  // fails allocations on purpose: ERRORs off stderr
  TestRegion region(4 * kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(*allocator.Allocate(kMiB));
  ASSERT_TRUE(allocator.Free(blocks[0]).ok());
  ASSERT_TRUE(allocator.Free(blocks[2]).ok());
  absl::StatusOr<void*> p = allocator.Allocate(2 * kMiB);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("There are 2.00M free. Largest free block: 1.00M "
                        "(fragmentation 50.0%)"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("fragmented"));
  EXPECT_DOUBLE_EQ(allocator.GetStats().fragmentation, 0.5);
}

TEST(RegionAllocatorTest, ThresholdEdges) {
  TestRegion region(4 * kMiB);
  RegionAllocator allocator(region.base(), region.size(), {.threshold = kMiB});
  absl::StatusOr<void*> equal = allocator.Allocate(kMiB);
  EXPECT_TRUE(equal.ok());
  absl::StatusOr<void*> over = allocator.Allocate(kMiB + 1);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(over.status().message());
  EXPECT_THAT(
      message,
      HasSubstr("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=1048576"));
  EXPECT_THAT(message, StartsWith("Attempting to allocate 1.00M, which is "
                                  "larger than"));
  EXPECT_THAT(message, HasSubstr("Raise TPU_PREMAPPED_BUFFER_TRANSFER_"
                                 "THRESHOLD_BYTES to at least 1052672"));
  EXPECT_EQ(allocator.GetStats().failures, 1u);
}

TEST(RegionAllocatorTest, ThresholdHintNeverSuggestsTheSettingInForce) {
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  EXPECT_EQ(allocator.threshold(), kMiB);
  absl::StatusOr<void*> over = allocator.Allocate(kMiB + 1);
  ASSERT_FALSE(over.ok());
  const std::string message(over.status().message());
  EXPECT_THAT(message, Not(HasSubstr("Raise TPU_PREMAPPED_BUFFER_TRANSFER")));
  EXPECT_THAT(message, HasSubstr("raise TPU_PREMAPPED_BUFFER_SIZE to at least "
                                 "1052672"));
}

TEST(RegionAllocatorTest, ZeroSizeIsInvalidArgument) {
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  EXPECT_EQ(allocator.Allocate(0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator.GetStats().allocations, 0u);
}

TEST(RegionAllocatorTest, SizesAreExactUpTo64Bytes) {
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  void* a = *allocator.Allocate(1);
  void* b = *allocator.Allocate(100);
  void* c = *allocator.Allocate(4096);
  EXPECT_EQ(allocator.AllocationSize(a), 64u);
  EXPECT_EQ(allocator.AllocationSize(b), 128u);
  EXPECT_EQ(allocator.AllocationSize(c), 4096u);
  EXPECT_EQ(allocator.GetStats().bytes_in_use, 64u + 128u + 4096u);
  EXPECT_EQ(allocator.AllocationSize(static_cast<char*>(b) + 64), 0u);
  ExpectConsistent(allocator);
}

TEST(RegionAllocatorTest, FillsTheRegionExactly) {
  ScopedTestLogging logs;  // fails allocations on purpose: ERRORs off stderr
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<void*> p = allocator.Allocate(64 * 1024);
    ASSERT_TRUE(p.ok()) << i << p.status();
    blocks.push_back(*p);
  }
  EXPECT_EQ(allocator.GetStats().free_bytes, 0u);
  EXPECT_FALSE(allocator.Allocate(64).ok());
  for (void* p : blocks) ASSERT_TRUE(allocator.Free(p).ok());
  const RegionAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(stats.free_blocks, 1u);
  EXPECT_EQ(stats.largest_free_block, kMiB);
  EXPECT_EQ(stats.peak_bytes_in_use, kMiB);
  ExpectConsistent(allocator);
}

class AlignmentTest : public ::testing::TestWithParam<size_t> {};

TEST_P(AlignmentTest, ReturnsAlignedBlocks) {
  TestRegion region(4 * kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  std::vector<void*> blocks;
  for (int i = 0; i < 50; ++i) {
    // Odd sizes knock later blocks off any natural alignment.
    ASSERT_TRUE(allocator.Allocate(64 * (1 + i % 3)).ok());
    absl::StatusOr<void*> p = allocator.Allocate(1000, GetParam());
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(
        reinterpret_cast<uintptr_t>(*p) % std::max<size_t>(GetParam(), 64), 0u);
    blocks.push_back(*p);
  }
  ExpectConsistent(allocator);
  for (void* p : blocks) ASSERT_TRUE(allocator.Free(p).ok());
  ExpectConsistent(allocator);
}

INSTANTIATE_TEST_SUITE_P(PowersOfTwo, AlignmentTest,
                         ::testing::Values(1, 8, 64, 128, 256, 1024, 4096));

TEST(RegionAllocatorTest, RegionOfNBytesHoldsOneNByteBufferAtAnyAlignment) {
  // Users size the region to their largest transfer.
  for (size_t alignment : {size_t{64}, size_t{1024}, size_t{4096}}) {
    TestRegion region(64 * kMiB);
    RegionAllocator allocator(region.base(), region.size(), {});
    absl::StatusOr<void*> p = allocator.Allocate(64 * kMiB, alignment);
    ASSERT_TRUE(p.ok()) << alignment << ": " << p.status();
    EXPECT_EQ(*p, region.base());
    ExpectConsistent(allocator);
    ASSERT_TRUE(allocator.Free(*p).ok());
    // The staging path's TryAllocate finds it too.
    void* q = allocator.TryAllocate(64 * kMiB, alignment);
    EXPECT_EQ(q, region.base()) << alignment;
    ASSERT_TRUE(allocator.Free(q).ok());
  }
}

TEST(RegionAllocatorTest, AlignedRequestFitsAnAlignedFreeBlockOfItsSize) {
  ScopedTestLogging logs;  // fails allocations on purpose: ERRORs off stderr
  // Three page-sized blocks with the middle one freed: the only free space
  // that holds a page-aligned page is exactly one page, plus an unaligned
  // 64-byte crumb at the end that must not be mistaken for room.
  TestRegion region(3 * 4096 + 64);
  RegionAllocator allocator(region.base(), region.size(), {});
  absl::StatusOr<void*> a = allocator.Allocate(4096, 4096);
  absl::StatusOr<void*> b = allocator.Allocate(4096, 4096);
  absl::StatusOr<void*> c = allocator.Allocate(4096, 4096);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(allocator.Free(*b).ok());
  absl::StatusOr<void*> again = allocator.Allocate(4096, 4096);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *b);
  ExpectConsistent(allocator);
  // No aligned page is free now: a clean RESOURCE_EXHAUSTED.
  EXPECT_EQ(allocator.Allocate(4096, 4096).status().code(),
            absl::StatusCode::kResourceExhausted);
  ExpectConsistent(allocator);
}

TEST(RegionAllocatorTest, AlignedFitSplitsTheLeadingPadBackToTheFreeLists) {
  // A free block of 2 pages starting 64 bytes past a page boundary holds a
  // page-aligned page (not at its start): the 4032-byte pad and the tail
  // stay free and usable.
  TestRegion region(3 * 4096);
  RegionAllocator allocator(region.base(), region.size(), {});
  absl::StatusOr<void*> head = allocator.Allocate(64);
  absl::StatusOr<void*> rest = allocator.Allocate(2 * 4096 - 64);
  absl::StatusOr<void*> last = allocator.Allocate(4096);
  ASSERT_TRUE(head.ok() && rest.ok() && last.ok());
  ASSERT_TRUE(allocator.Free(*rest).ok());
  absl::StatusOr<void*> page = allocator.Allocate(4096, 4096);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*page) % 4096, 0u);
  ExpectConsistent(allocator);
  EXPECT_EQ(allocator.GetStats().free_bytes, 4096u - 64);
  absl::StatusOr<void*> pad = allocator.Allocate(4096 - 64);
  ASSERT_TRUE(pad.ok()) << pad.status();
  ExpectConsistent(allocator);
}

TEST(RegionAllocatorTest, BadAlignmentIsInvalidArgument) {
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  for (size_t alignment : {size_t{0}, size_t{3}, size_t{96}, size_t{8192}}) {
    EXPECT_EQ(allocator.Allocate(64, alignment).status().code(),
              absl::StatusCode::kInvalidArgument)
        << alignment;
  }
}

TEST(RegionAllocatorTest, DoubleFreeIsDetectedAndChangesNothing) {
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  void* a = *allocator.Allocate(4096);
  void* b = *allocator.Allocate(4096);
  ASSERT_TRUE(allocator.Free(a).ok());
  const RegionAllocator::Stats before = allocator.GetStats();
  const absl::Status s = allocator.Free(a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a live allocation"));
  const RegionAllocator::Stats after = allocator.GetStats();
  EXPECT_EQ(after.frees, before.frees);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(allocator.Free(static_cast<char*>(b) + 64).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectConsistent(allocator);
  EXPECT_TRUE(allocator.Free(b).ok());
}

TEST(RegionAllocatorTest, ForeignPointerIsDetected) {
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  int outside = 0;
  const absl::Status s = allocator.Free(&outside);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not inside the premapped"));
  EXPECT_EQ(allocator.Free(nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator.Free(static_cast<char*>(region.base()) + kMiB).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectConsistent(allocator);
}

TEST(RegionAllocatorTest, ContainsChecksWholeRanges) {
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  char* base = static_cast<char*>(region.base());
  EXPECT_TRUE(allocator.Contains(base, kMiB));
  EXPECT_TRUE(allocator.Contains(base + kMiB - 1, 1));
  EXPECT_TRUE(allocator.Contains(base + kMiB, 0));
  EXPECT_FALSE(allocator.Contains(base + kMiB, 1));
  EXPECT_FALSE(allocator.Contains(base + 1, kMiB));
  EXPECT_FALSE(allocator.Contains(base - 1, 2));
  EXPECT_FALSE(allocator.Contains(base, ~uint64_t{0}));
}

TEST(RegionAllocatorTest, InjectedAllocFaultLooksLikeARealOne) {
  ScopedTestLogging logs;  // fails allocations on purpose: ERRORs off stderr
  absl::StatusOr<FaultSpec> spec = ParseFaultSpec("alloc:nth=2");
  ASSERT_TRUE(spec.ok());
  FaultInjector faults(*spec);
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {.faults = &faults});
  EXPECT_TRUE(allocator.Allocate(4096).ok());
  absl::StatusOr<void*> p = allocator.Allocate(4096);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()),
              StartsWith("Attempting to allocate 4.0K. That was not possible. "
                         "There are 1020.0K free."));
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("[injected: alloc:nth=2]"));
  EXPECT_EQ(allocator.GetStats().failures, 1u);
  EXPECT_EQ(allocator.GetStats().live_allocations, 1u);
  EXPECT_TRUE(allocator.Allocate(4096).ok());
}

TEST(RegionAllocatorTest, DebugDumpShowsClassesAndOccupancy) {
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  ASSERT_TRUE(allocator.Allocate(kMiB / 2).ok());
  const std::string dump = allocator.DebugDump();
  EXPECT_THAT(dump, HasSubstr("largest free blocks: 512.0K"));
  EXPECT_THAT(dump, HasSubstr("in use 1 blocks 512.0K"));
  const size_t map_at = dump.find("free): ");
  ASSERT_NE(map_at, std::string::npos);
  const std::string map = dump.substr(map_at + 7);
  EXPECT_EQ(map, std::string(50, '#') + std::string(50, '.'));
}

TEST(RegionAllocatorTest, ResetPeakStartsFromCurrentUse) {
  TestRegion region(kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  void* a = *allocator.Allocate(4096);
  void* b = *allocator.Allocate(4096);
  ASSERT_TRUE(allocator.Free(a).ok());
  EXPECT_EQ(allocator.GetStats().peak_bytes_in_use, 8192u);
  allocator.ResetPeak();
  EXPECT_EQ(allocator.GetStats().peak_bytes_in_use, 4096u);
  ASSERT_TRUE(allocator.Free(b).ok());
}

// Random allocate/free against a reference model of live ranges.
TEST(RegionAllocatorTest, RandomizedAgainstReferenceModel) {
  ScopedTestLogging logs;  // fails allocations on purpose: ERRORs off stderr
  TestRegion region(8 * kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  std::mt19937_64 rng(20261121);
  std::map<uintptr_t, uint64_t> live;  // address -> requested size
  const uintptr_t begin = reinterpret_cast<uintptr_t>(region.base());
  const uintptr_t end = begin + region.size();
  uint64_t failures = 0;
  for (int op = 0; op < 20000; ++op) {
    if (live.empty() || rng() % 100 < 55) {
      const uint64_t size =
          1 + (rng() % 2 ? rng() % 512 : rng() % (256 * 1024));
      const size_t alignment = size_t{1} << (rng() % 13);
      absl::StatusOr<void*> p = allocator.Allocate(size, alignment);
      if (!p.ok()) {
        ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
        ++failures;
        continue;
      }
      const uintptr_t a = reinterpret_cast<uintptr_t>(*p);
      ASSERT_GE(a, begin);
      ASSERT_LE(a + size, end);
      ASSERT_EQ(a % std::max<size_t>(alignment, 64), 0u);
      auto next = live.lower_bound(a);
      if (next != live.end()) {
        ASSERT_LE(a + size, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, a);
      }
      live.emplace(a, size);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(allocator.Free(reinterpret_cast<void*>(it->first)).ok());
      live.erase(it);
    }
    if (op % 1000 == 0) {
      ASSERT_TRUE(RegionAllocatorTestPeer::CheckInvariants(allocator).ok());
      ASSERT_EQ(allocator.GetStats().live_allocations, live.size());
    }
  }
  EXPECT_GT(failures, 0u);  // the mix does run the region full
  for (const auto& [a, size] : live) {
    ASSERT_TRUE(allocator.Free(reinterpret_cast<void*>(a)).ok());
  }
  const RegionAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_EQ(stats.live_allocations, 0u);
  EXPECT_EQ(stats.free_blocks, 1u);
  EXPECT_EQ(stats.largest_free_block, region.size());
  EXPECT_EQ(stats.allocations, stats.frees);
  ExpectConsistent(allocator);
}

// Threads allocate, fill with their own pattern, verify and free: any
// overlap between live blocks shows up as a corrupted pattern.
TEST(RegionAllocatorTest, ConcurrentChurnKeepsBlocksDisjoint) {
  TestRegion region(16 * kMiB);
  RegionAllocator allocator(region.base(), region.size(), {});
  constexpr int kThreads = 4;
  std::atomic<int> corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      std::vector<std::pair<unsigned char*, uint64_t>> mine;
      const unsigned char pattern = static_cast<unsigned char>(0x10 + t);
      for (int op = 0; op < 5000; ++op) {
        if (mine.empty() || (rng() % 2 && mine.size() < 64)) {
          const uint64_t size = 1 + rng() % (64 * 1024);
          absl::StatusOr<void*> p = allocator.Allocate(size);
          if (!p.ok()) continue;
          auto* bytes = static_cast<unsigned char*>(*p);
          std::memset(bytes, pattern, size);
          mine.emplace_back(bytes, size);
        } else {
          const size_t i = rng() % mine.size();
          auto [bytes, size] = mine[i];
          for (uint64_t k = 0; k < size; k += 61) {
            if (bytes[k] != pattern) ++corrupt;
          }
          if (!allocator.Free(bytes).ok()) ++corrupt;
          mine[i] = mine.back();
          mine.pop_back();
        }
      }
      for (auto [bytes, size] : mine) {
        if (!allocator.Free(bytes).ok()) ++corrupt;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(corrupt.load(), 0);
  const RegionAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_EQ(stats.live_allocations, 0u);
  EXPECT_EQ(stats.free_blocks, 1u);
  ExpectConsistent(allocator);
}

}  // namespace
}  // namespace tpushim
