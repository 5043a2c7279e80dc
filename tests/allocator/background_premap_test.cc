// A region premapped behind the caller (TPUSHIM_PREMAP=background): the
// allocator serves the populated low end as it grows and waits only for
// what is not ready; the region's thread populates, locks and reports in
// order; destroying the region mid-way stops the work and leaves nothing
// mapped or locked; a failure part-way leaves the populated part usable.

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "allocator/prefaulter.h"
#include "allocator/premapped_region.h"
#include "allocator/region_allocator.h"
#include "env/fault_injection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/allocator/region_test_support.h"
#include "tests/testing/scoped_test_logging.h"

namespace tpushim {

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kMiB = uint64_t{1} << 20;

using Memory = testutil::TestRegion;
using testutil::ExpectConsistent;

TEST(RegionGrowthTest, ServesNothingUntilGrownThenOnlyTheReadyPart) {
  Memory m(8 * kMiB);
  RegionAllocator a(m.base(), 8 * kMiB, {.grows = true});
  EXPECT_EQ(a.ready_bytes(), 0u);
  EXPECT_TRUE(a.growing());
  EXPECT_EQ(a.TryAllocate(64), nullptr);
  EXPECT_EQ(a.GetStats().free_bytes, 0u);
  ExpectConsistent(a);

  a.Grow(2 * kMiB);
  EXPECT_EQ(a.ready_bytes(), 2 * kMiB);
  void* p = a.TryAllocate(2 * kMiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p, m.base());
  EXPECT_EQ(a.TryAllocate(64), nullptr);  // the rest is not ready
  ExpectConsistent(a);
  const RegionAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.ready_bytes, 2 * kMiB);
  EXPECT_TRUE(s.growing);
  EXPECT_EQ(s.free_bytes, 0u);
  EXPECT_EQ(s.ready_waits, 0u);
  ASSERT_TRUE(a.Free(p).ok());
  ExpectConsistent(a);
}

TEST(RegionGrowthTest, GrowingMergesTheNewPartWithAFreeEnd) {
  Memory m(8 * kMiB);
  RegionAllocator a(m.base(), 8 * kMiB, {.grows = true});
  a.Grow(kMiB);
  void* p = a.TryAllocate(512 * 1024);
  ASSERT_NE(p, nullptr);
  a.Grow(3 * kMiB);
  a.Grow(2 * kMiB);  // smaller: ignored
  EXPECT_EQ(a.ready_bytes(), 3 * kMiB);
  // One free block from the end of p to the ready end.
  EXPECT_EQ(a.GetStats().largest_free_block, 3 * kMiB - 512 * 1024);
  EXPECT_EQ(a.GetStats().free_blocks, 1u);
  a.Grow(8 * kMiB + 4096);  // past the capacity: the capacity
  EXPECT_EQ(a.ready_bytes(), 8 * kMiB);
  EXPECT_FALSE(a.growing());
  ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(a.GetStats().largest_free_block, 8 * kMiB);
  EXPECT_EQ(a.GetStats().free_blocks, 1u);
  ExpectConsistent(a);
}

TEST(RegionGrowthTest, AllocateWaitsForTheRegionToGrowAndCountsTheWait) {
  testutil::ScopedTestLogging logs({{"region_allocator", 1}});
  Memory m(8 * kMiB);
  RegionAllocator a(m.base(), 8 * kMiB, {.grows = true});
  a.Grow(kMiB);
  // Served from the ready part: no wait.
  absl::StatusOr<void*> small = a.Allocate(kMiB / 2);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(a.GetStats().ready_waits, 0u);

  std::atomic<bool> returned{false};
  absl::StatusOr<void*> big;
  std::thread t([&] {
    big = a.Allocate(4 * kMiB);
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(returned.load());  // 4 MiB are not ready
  a.Grow(4 * kMiB);               // still not enough after `small`
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(returned.load());
  a.Grow(6 * kMiB);
  t.join();
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_GE(static_cast<char*>(*big), static_cast<char*>(m.base()) + kMiB / 2);
  EXPECT_LE(static_cast<char*>(*big) + 4 * kMiB,
            static_cast<char*>(m.base()) + 6 * kMiB);
  const RegionAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.ready_waits, 1u);
  EXPECT_GE(s.ready_wait_ns, 50'000'000);
  EXPECT_EQ(s.failures, 0u);
  ExpectConsistent(a);
  // TPU_VMODULE=region_allocator=1 logs the wait.
  EXPECT_THAT(logs.File("INFO"),
              HasSubstr("Allocating 4.00M from the premapped region waited "));
  EXPECT_THAT(logs.File("INFO"),
              HasSubstr(" ms for it to be premapped (6291456 of 8388608 "
                        "bytes ready)"));
}

// A Free during growth wakes an Allocate that the freed block serves,
// without waiting for the next Grow.
TEST(RegionGrowthTest, AFreeWakesAWaiterItCanServe) {
  Memory m(8 * kMiB);
  RegionAllocator a(m.base(), 8 * kMiB, {.grows = true});
  a.Grow(2 * kMiB);
  absl::StatusOr<void*> held = a.Allocate(2 * kMiB);
  ASSERT_TRUE(held.ok());
  absl::StatusOr<void*> waiting;
  std::thread t([&] { waiting = a.Allocate(kMiB); });
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(a.Free(*held).ok());
  t.join();  // would hang until the test's end without the wake-up
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(*waiting, m.base());
  EXPECT_TRUE(a.growing());
  ASSERT_TRUE(a.Free(*waiting).ok());
  ExpectConsistent(a);
}

TEST(RegionGrowthTest, StopGrowingWakesWaitersWithTheReasonInTheError) {
  testutil::ScopedTestLogging logs;
  Memory m(8 * kMiB);
  RegionAllocator a(m.base(), 8 * kMiB, {.grows = true});
  a.Grow(kMiB);
  absl::StatusOr<void*> big;
  std::thread t([&] { big = a.Allocate(2 * kMiB); });
  absl::SleepFor(absl::Milliseconds(20));
  a.StopGrowing(absl::InternalError("madvise: Cannot allocate memory"));
  t.join();
  ASSERT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(),
              HasSubstr("That was not possible. There are 1.00M free."));
  EXPECT_THAT(big.status().message(),
              HasSubstr("Premapping the region stopped after 1048576 of its "
                        "8388608 bytes (INTERNAL: madvise: Cannot allocate "
                        "memory); the rest of it is not used."));
  EXPECT_FALSE(a.growing());
  a.Grow(8 * kMiB);  // after the stop: ignored
  EXPECT_EQ(a.ready_bytes(), kMiB);
  // The ready part goes on serving.
  absl::StatusOr<void*> p = a.Allocate(kMiB);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(a.GetStats().ready_waits, 1u);
  EXPECT_EQ(a.GetStats().failures, 1u);
  ExpectConsistent(a);
}

// A request that the whole region could not hold with the buffers now
// live fails at once instead of waiting for premapping to end.
TEST(RegionGrowthTest, AnAllocationThatCannotFitEvenWholeFailsAtOnce) {
  testutil::ScopedTestLogging logs;
  Memory m(8 * kMiB);
  RegionAllocator a(m.base(), 8 * kMiB, {.grows = true});
  a.Grow(kMiB);
  absl::StatusOr<void*> held = a.Allocate(kMiB);
  ASSERT_TRUE(held.ok());
  absl::Notification returned;
  absl::StatusOr<void*> big;
  std::thread t([&] {
    big = a.Allocate(8 * kMiB);  // 1 MiB of the 8 is taken for good
    returned.Notify();
  });
  // Bounded only so that a wait fails the test instead of hanging it.
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "Allocate waited for a region that can never hold it";
  EXPECT_TRUE(a.growing());
  a.StopGrowing(absl::CancelledError("test over"));
  t.join();
  ASSERT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted)
      << big.status();
  EXPECT_THAT(big.status().message(),
              HasSubstr("The region is still being premapped (1048576 of "
                        "8388608 bytes ready;"));
  EXPECT_THAT(big.status().message(),
              HasSubstr("TPU_PREMAPPED_BUFFER_SIZE would have to be at least "
                        "9437184"));
  EXPECT_EQ(a.GetStats().ready_waits, 0u);

  ASSERT_TRUE(a.Free(*held).ok());
  ExpectConsistent(a);
}

TEST(RegionGrowthTest, NoWaitIsUnavailableWhereAllocateWouldWait) {
  testutil::ScopedTestLogging logs;
  Memory m(8 * kMiB);
  RegionAllocator a(m.base(), 8 * kMiB, {.grows = true});
  a.Grow(kMiB);
  using IfNotReady = RegionAllocator::IfNotReady;
  // Served from the ready part: no difference.
  absl::StatusOr<void*> small = a.Allocate(kMiB / 2, 64, IfNotReady::kFail);
  ASSERT_TRUE(small.ok()) << small.status();
  absl::StatusOr<void*> big = a.Allocate(4 * kMiB, 64, IfNotReady::kFail);
  ASSERT_EQ(big.status().code(), absl::StatusCode::kUnavailable)
      << big.status();
  EXPECT_THAT(big.status().message(),
              HasSubstr("Attempting to allocate 4.00M from the premapped "
                        "region: not premapped yet (1048576 of 8388608 bytes "
                        "ready, TPUSHIM_PREMAP=background)"));
  EXPECT_EQ(a.GetStats().ready_waits, 0u);
  EXPECT_EQ(a.GetStats().failures, 1u);
  // Not an out-of-memory: nothing at ERROR.
  EXPECT_EQ(logs.File("ERROR"), "");
  a.Grow(8 * kMiB);
  big = a.Allocate(4 * kMiB, 64, IfNotReady::kFail);
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_TRUE(a.Free(*big).ok());
  ASSERT_TRUE(a.Free(*small).ok());
  ExpectConsistent(a);
}

// The owner going away (StopGrowing with CANCELLED) ends a wait with
// CANCELLED, not with an out-of-memory report.
TEST(RegionGrowthTest, CancelledGrowthEndsAWaitWithCancelled) {
  testutil::ScopedTestLogging logs;
  Memory m(8 * kMiB);
  RegionAllocator a(m.base(), 8 * kMiB, {.grows = true});
  absl::StatusOr<void*> big;
  std::thread t([&] { big = a.Allocate(2 * kMiB); });
  absl::SleepFor(absl::Milliseconds(20));
  a.StopGrowing(absl::CancelledError("the system is being destroyed"));
  t.join();
  ASSERT_EQ(big.status().code(), absl::StatusCode::kCancelled) << big.status();
  EXPECT_THAT(big.status().message(),
              HasSubstr("Attempting to allocate 2.00M from the premapped "
                        "region: premapping the region was stopped while the "
                        "allocation waited for it (the system is being "
                        "destroyed)"));
  EXPECT_EQ(logs.File("ERROR"), "");
}

TEST(RegionGrowthTest, DumpShowsThePartNotPremapped) {
  Memory m(8 * kMiB);
  RegionAllocator a(m.base(), 8 * kMiB, {.grows = true});
  a.Grow(2 * kMiB);
  ASSERT_NE(a.TryAllocate(kMiB), nullptr);
  const std::string dump = a.DebugDump();
  EXPECT_THAT(dump, HasSubstr("not premapped (not served): the last 6.00M"));
  EXPECT_THAT(dump, HasSubstr("' ' not premapped"));
  // 100 cells: 12.5 used, 12.5 free, 75 not premapped.
  EXPECT_THAT(dump, HasSubstr(std::string(12, '#') + "+" +
                              std::string(12, '.') + std::string(75, ' ')));
}

TEST(RegionGrowthTest, ThreadsAllocateAndFreeWhileTheRegionGrows) {
  constexpr uint64_t kSize = 16 * kMiB;
  Memory m(kSize);
  RegionAllocator a(m.base(), kSize, {.grows = true});
  std::atomic<bool> outside{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<void*, uint64_t>> held;
      for (int i = 0; i < 400; ++i) {
        const uint64_t size = 64 + rng() % (256 * 1024);
        absl::StatusOr<void*> p = a.Allocate(size);  // may wait
        ASSERT_TRUE(p.ok()) << p.status();
        // Served only from what was ready.
        const uint64_t end =
            static_cast<char*>(*p) + size - static_cast<char*>(m.base());
        if (end > a.ready_bytes()) outside = true;
        std::memset(*p, t, 64);
        held.emplace_back(*p, size);
        if (held.size() > 8) {
          ASSERT_TRUE(a.Free(held.front().first).ok());
          held.erase(held.begin());
        }
      }
      for (auto& [p, size] : held) ASSERT_TRUE(a.Free(p).ok());
    });
  }
  for (uint64_t ready = 0; ready <= kSize; ready += 256 * 1024) {
    a.Grow(ready);
    std::this_thread::yield();
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(outside.load());
  EXPECT_EQ(a.GetStats().live_allocations, 0u);
  EXPECT_EQ(a.GetStats().largest_free_block, kSize);
  ExpectConsistent(a);
}

// ---- The region premapped behind the caller ---------------------------------

// The real OS with a fixed environment; pre-faulting can be held at a gate
// (each MADV_POPULATE_WRITE waits for it) and made to fail at the Nth call.
class GatedOs : public OsWrapper {
 public:
  explicit GatedOs(Os* target) : OsWrapper(target) {}

  std::map<std::string, std::string> env;
  std::atomic<bool> gate_closed{false};
  std::atomic<int> sleep_ms{0};  // each populate call sleeps this long
  std::atomic<int> populates{0};
  int fail_at = 0;  // 1-based populate call that fails; 0: none

  std::optional<std::string> GetEnv(const std::string& name) override {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  }
  absl::Status Madvise(void* addr, size_t length, int advice) override {
    if (advice == MADV_POPULATE_WRITE) {
      while (gate_closed.load()) absl::SleepFor(absl::Milliseconds(1));
      if (sleep_ms.load() > 0)
        absl::SleepFor(absl::Milliseconds(sleep_ms.load()));
      if (++populates == fail_at) {
        return absl::ResourceExhaustedError("madvise(MADV_POPULATE_WRITE)");
      }
    }
    return OsWrapper::Madvise(addr, length, advice);
  }
};

Options BackgroundOptions(Os& os, uint64_t size) {
  OptionOverrides o;
  o.premapped_buffer_size = size;
  o.premap = PremapMode::kBackground;
  o.hugepages = HugePagesMode::kOff;  // 4 KiB pages: 8 chunks of size/8
  o.prefault_threads = 2;
  absl::StatusOr<Options> options = ResolveOptions(os, o);
  EXPECT_TRUE(options.ok()) << options.status();
  return *options;
}

TEST(BackgroundPremapTest, CreateReturnsBeforeAnyPageIsPopulated) {
  testutil::ScopedTestLogging logs;
  GatedOs gated(Os::Default());
  FaultInjectingOs os(&gated, nullptr);
  gated.gate_closed = true;
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(BackgroundOptions(gated, 16 * kMiB), &os,
                              nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  PremappedRegion& r = **region;
  EXPECT_TRUE(r.background());
  EXPECT_EQ(gated.populates.load(), 0);
  EXPECT_EQ(r.allocator().ready_bytes(), 0u);
  PremappedRegion::Stats stats = r.GetStats();
  EXPECT_TRUE(stats.background);
  EXPECT_FALSE(stats.premapped);
  EXPECT_EQ(stats.startup_time, absl::ZeroDuration());
  // Locked on fault is locked (tests run as root, with CAP_IPC_LOCK):
  // nothing resident yet, every page locked as it comes.
  EXPECT_TRUE(stats.lock_requested);
  EXPECT_TRUE(stats.locked);
  EXPECT_TRUE(stats.lock_error.ok()) << stats.lock_error;
  EXPECT_EQ(stats.locked_bytes, 0u);
  // Start-up lines up to the alignment, none of the premapping ones yet.
  const std::string info = logs.File("INFO");
  EXPECT_THAT(info, HasSubstr("Premapped buffer is using alignment 64"));
  EXPECT_THAT(info, Not(HasSubstr("Done premapping memory")));

  std::vector<uint64_t> progress;
  std::vector<uint64_t> extended;
  std::set<std::thread::id> hook_threads;  // one: the premapping thread
  std::optional<absl::Status> done;
  r.StartPremapping(PremappedRegion::BackgroundHooks{
      .extend_dma =
          [&](uint64_t ready) {
            // Reachable by DMA before the allocator serves it.
            EXPECT_LT(r.allocator().ready_bytes(), ready);
            extended.push_back(ready);
            hook_threads.insert(std::this_thread::get_id());
            return absl::OkStatus();
          },
      .on_progress =
          [&](uint64_t done_bytes, uint64_t total) {
            EXPECT_EQ(total, 16 * kMiB);
            progress.push_back(done_bytes);
            hook_threads.insert(std::this_thread::get_id());
          },
      .on_done = [&](const absl::Status& s) { done = s; }});
  gated.gate_closed = false;
  ASSERT_TRUE(r.WaitUntilPremapped().ok());
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->ok());
  EXPECT_EQ(r.allocator().ready_bytes(), 16 * kMiB);
  ASSERT_FALSE(progress.empty());
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_EQ(progress.back(), 16 * kMiB);
  EXPECT_EQ(extended, progress);
  EXPECT_EQ(hook_threads.size(), 1u);
  EXPECT_EQ(hook_threads.count(std::this_thread::get_id()), 0u);
  stats = r.GetStats();
  EXPECT_TRUE(stats.premapped);
  EXPECT_TRUE(stats.locked);
  EXPECT_EQ(stats.locked_bytes, 16 * kMiB);
  EXPECT_GT(stats.startup_time, absl::ZeroDuration());
  EXPECT_TRUE(stats.premap_error.ok());
  const std::string after = logs.File("INFO");
  EXPECT_THAT(after, HasSubstr("] mlock()-ed 16777216 bytes for premapped "
                               "region, using 1 syscalls.\n"));
  EXPECT_THAT(after, HasSubstr("] Done allocating premapped memory of size "
                               "16777216\n"));
  region->reset();
  EXPECT_EQ(os.mapped_bytes(), 0u);
  EXPECT_EQ(os.locked_bytes(), 0u);
}

// Progress ends at the size asked for, also when the mapping is larger
// (rounded up to whole huge pages).
TEST(BackgroundPremapTest, ProgressEndsAtTheSizeAskedFor) {
  GatedOs gated(Os::Default());
  OptionOverrides o;
  o.premapped_buffer_size = 6 * kMiB + 4096;
  o.premap = PremapMode::kBackground;
  o.hugepages = HugePagesMode::kAuto;
  absl::StatusOr<Options> options = ResolveOptions(gated, o);
  ASSERT_TRUE(options.ok());
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(*options, &gated, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  (*region)->StartPremapping(PremappedRegion::BackgroundHooks{
      .extend_dma = nullptr,
      .on_progress = [&](uint64_t done,
                         uint64_t total) { seen.emplace_back(done, total); },
      .on_done = nullptr});
  ASSERT_TRUE((*region)->WaitUntilPremapped().ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), std::make_pair(6 * kMiB + 4096, 6 * kMiB + 4096));
  for (const auto& [done, total] : seen) EXPECT_LE(done, total);
  EXPECT_EQ((*region)->allocator().ready_bytes(), 6 * kMiB + 4096);
}

TEST(BackgroundPremapTest, DestroyedMidWayStopsAndLeavesNothingBehind) {
  testutil::ScopedTestLogging logs;
  GatedOs gated(Os::Default());
  FaultInjectingOs os(&gated, nullptr);
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(BackgroundOptions(gated, 64 * kMiB), &os,
                              nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  std::optional<absl::Status> done;
  absl::Notification some_ready;
  // Pre-faulting slow enough that destruction comes mid-way (a slow hook
  // no longer slows the workers down).
  gated.sleep_ms = 50;
  (*region)->StartPremapping(PremappedRegion::BackgroundHooks{
      .extend_dma = nullptr,
      .on_progress =
          [&](uint64_t, uint64_t) {
            if (!some_ready.HasBeenNotified()) some_ready.Notify();
          },
      .on_done = [&](const absl::Status& s) { done = s; }});
  some_ready.WaitForNotification();
  // An allocation waiting for more of the region when it is destroyed
  // returns (it cannot be served) instead of hanging.
  std::thread waiter([&] {
    absl::StatusOr<void*> p = (*region)->allocator().Allocate(60 * kMiB);
    if (p.ok()) {
      ASSERT_TRUE((*region)->allocator().Free(*p).ok());
    }
  });
  absl::SleepFor(absl::Milliseconds(5));
  (*region)->StopPremapping();
  waiter.join();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->code(), absl::StatusCode::kCancelled) << *done;
  EXPECT_LT((*region)->allocator().ready_bytes(), 64 * kMiB);
  EXPECT_THAT(logs.File("INFO"),
              HasSubstr("bytes: the system is being destroyed"));
  region->reset();
  EXPECT_EQ(os.mapped_bytes(), 0u);
  EXPECT_EQ(os.locked_bytes(), 0u);
}

// The ready point is one thread, the one that runs the pre-faulter: every
// hook (an IOMMU mapping step, progress) runs there, with no lock held, so
// a slow hook does not hold up the workers populating the next chunks.
TEST(PrefaulterTest, ReadyCallsComeFromTheRunThreadWhileWorkersGoOn) {
  GatedOs os(Os::Default());
  constexpr uint64_t kLength = 8 * kMiB;  // 8 chunks of 1 MiB
  Memory m(kLength);
  std::vector<std::thread::id> ids;
  std::vector<uint64_t> prefixes;
  bool saw_everything_populated = false;
  Prefaulter* running = nullptr;
  Prefaulter prefaulter(
      os, static_cast<char*>(m.base()), kLength, 4096, 0, [&](uint64_t ready) {
        ids.push_back(std::this_thread::get_id());
        prefixes.push_back(ready);
        if (prefixes.size() > 1) return;
        // The first call blocks until every chunk is populated: the
        // workers must get there without it. Bounded only so that a
        // worker stuck behind this call fails the test instead of hanging.
        const absl::Time deadline = absl::Now() + absl::Seconds(20);
        while (running->done_bytes() < kLength && absl::Now() < deadline) {
          absl::SleepFor(absl::Milliseconds(1));
        }
        saw_everything_populated = running->done_bytes() == kLength;
      });
  running = &prefaulter;
  ASSERT_EQ(prefaulter.ThreadsFor(4), 4);
  ASSERT_TRUE(prefaulter.Run(4).ok());
  EXPECT_TRUE(saw_everything_populated)
      << "the workers stopped while a ready call ran";
  ASSERT_FALSE(ids.empty());
  for (const std::thread::id& id : ids) {
    EXPECT_EQ(id, std::this_thread::get_id());
  }
  EXPECT_TRUE(std::is_sorted(prefixes.begin(), prefixes.end()));
  EXPECT_EQ(prefixes.back(), kLength);
  EXPECT_EQ(prefaulter.ready_bytes(), kLength);
  EXPECT_EQ(os.populates.load(), 8);
}

// Stopping the background work releases an allocation waiting for it at
// once, before waiting for the chunk in progress (here, held at the gate).
TEST(BackgroundPremapTest, StopReleasesAWaitingAllocationFirst) {
  testutil::ScopedTestLogging logs;
  GatedOs gated(Os::Default());
  FaultInjectingOs os(&gated, nullptr);
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(BackgroundOptions(gated, 16 * kMiB), &os,
                              nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  PremappedRegion& r = **region;
  gated.gate_closed = true;
  r.StartPremapping({});
  absl::Notification allocate_returned;
  absl::StatusOr<void*> waiting;
  std::thread waiter([&] {
    waiting = r.allocator().Allocate(kMiB);
    allocate_returned.Notify();
  });
  absl::SleepFor(absl::Milliseconds(20));  // let it wait
  std::thread stopper([&] { r.StopPremapping(); });
  // Bounded only so that the old order fails the test instead of hanging.
  EXPECT_TRUE(
      allocate_returned.WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "the waiting allocation returned only after the chunk in progress";
  EXPECT_TRUE(gated.gate_closed.load());
  gated.gate_closed = false;
  stopper.join();
  waiter.join();
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kCancelled)
      << waiting.status();
  region->reset();
  EXPECT_EQ(os.mapped_bytes(), 0u);
  EXPECT_EQ(os.locked_bytes(), 0u);
}

TEST(BackgroundPremapTest, FailurePartWayLeavesThePopulatedPartInUse) {
  testutil::ScopedTestLogging logs;
  GatedOs gated(Os::Default());
  gated.fail_at = 5;
  FaultInjectingOs os(&gated, nullptr);
  Options options = BackgroundOptions(gated, 32 * kMiB);
  options.prefault_threads.value = 1;  // chunks in order: 4 ready
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(options, &os, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  PremappedRegion& r = **region;
  r.StartPremapping({});
  const absl::Status s = r.WaitUntilPremapped();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(r.allocator().ready_bytes(), 16 * kMiB);
  EXPECT_THAT(logs.File("ERROR"),
              HasSubstr("Premapping the region failed after 16777216 of "
                        "33554432 bytes: RESOURCE_EXHAUSTED: "
                        "madvise(MADV_POPULATE_WRITE); buffers and staging "
                        "use the first 16777216 bytes"));
  const PremappedRegion::Stats stats = r.GetStats();
  EXPECT_FALSE(stats.premapped);
  EXPECT_EQ(stats.premap_error.code(), absl::StatusCode::kResourceExhausted);
  // The first half serves; more fails at once, naming why.
  absl::StatusOr<void*> p = r.allocator().Allocate(16 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<void*> q = r.allocator().Allocate(64);
  EXPECT_THAT(q.status().message(),
              HasSubstr("Premapping the region stopped after 16777216"));
  ASSERT_TRUE(r.allocator().Free(*p).ok());
  region->reset();
  EXPECT_EQ(os.mapped_bytes(), 0u);
  EXPECT_EQ(os.locked_bytes(), 0u);
}

TEST(BackgroundPremapTest, ADmaExtensionThatFailsStopsPremappingThere) {
  testutil::ScopedTestLogging logs;
  GatedOs gated(Os::Default());
  FaultInjectingOs os(&gated, nullptr);
  Options options = BackgroundOptions(gated, 32 * kMiB);
  options.prefault_threads.value = 1;
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(options, &os, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  PremappedRegion& r = **region;
  // One step may cover several chunks (whatever finished meanwhile), so
  // the last accepted extent is whichever step came before the refusal.
  std::atomic<uint64_t> accepted{0};
  r.StartPremapping(PremappedRegion::BackgroundHooks{
      .extend_dma =
          [&accepted](uint64_t ready) {
            if (ready > 8 * kMiB) {
              return absl::ResourceExhaustedError("IOMMU full");
            }
            accepted.store(ready);
            return absl::OkStatus();
          },
      .on_progress = nullptr,
      .on_done = nullptr});
  EXPECT_EQ(r.WaitUntilPremapped().message(), "IOMMU full");
  // Never served beyond what the devices can reach.
  EXPECT_LE(r.allocator().ready_bytes(), 8 * kMiB);
  EXPECT_EQ(r.allocator().ready_bytes(), accepted.load());
  EXPECT_FALSE(r.allocator().growing());
  region->reset();
  EXPECT_EQ(os.mapped_bytes(), 0u);
  EXPECT_EQ(os.locked_bytes(), 0u);
}

TEST(BackgroundPremapTest, ForegroundRegionIsPremappedWhenCreateReturns) {
  GatedOs gated(Os::Default());
  OptionOverrides o;
  o.premapped_buffer_size = 8 * kMiB;
  absl::StatusOr<Options> options = ResolveOptions(gated, o);
  ASSERT_TRUE(options.ok());
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(*options, &gated, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_FALSE((*region)->background());
  EXPECT_TRUE((*region)->WaitUntilPremapped().ok());
  EXPECT_EQ((*region)->allocator().ready_bytes(), 8 * kMiB);
  EXPECT_FALSE((*region)->allocator().growing());
  EXPECT_TRUE((*region)->GetStats().premapped);
  (*region)->StopPremapping();  // nothing to stop
}

}  // namespace
}  // namespace tpushim
