// With the premapped region off, small transfers (and misaligned ones of
// any size) are staged through the engine's own pinned bounce pool instead
// of pinning the caller's pages per call; larger ones keep the pinned path.
// The pool is mapped, locked and registered once, excluded from fork(),
// counted in the stats, and gone after shutdown.

#include "transfer/bounce_pool.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "env/fault_injection.h"
#include "env/fork_guard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::TransferRig;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr int kH2d = 0;
constexpr int kD2h = 1;
constexpr int kStaged = static_cast<int>(TransferPath::kStaged);
constexpr int kPinned = static_cast<int>(TransferPath::kPinned);

std::unique_ptr<TransferRig> RegionOff(TransferRig::Params params = {}) {
  params.region_bytes = 0;
  if (params.engine.staging_wait == absl::Milliseconds(50)) {
    params.engine.staging_wait = absl::Seconds(10);
  }
  absl::StatusOr<std::unique_ptr<TransferRig>> rig =
      TransferRig::Create(std::move(params));
  EXPECT_TRUE(rig.ok()) << rig.status();
  return rig.ok() ? *std::move(rig) : nullptr;
}

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<char>(i * 131 + seed + (i >> 12));
  }
  return v;
}

// Host → device → host of `n` bytes from `src` into `dst`.
void RoundTrip(TransferEngine& engine, const char* src, char* dst, uint64_t n,
               int device = 0) {
  absl::StatusOr<DeviceBuffer> buffer = engine.Allocate(device, n);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  absl::StatusOr<Event> up = engine.TransferToDevice(src, *buffer, 0, n);
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<Event> down =
      engine.TransferFromDevice(*buffer, 0, dst, n, {*up});
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_TRUE(down->Await().ok()) << down->Await();
  absl::StatusOr<Event> freed = engine.Deallocate(*buffer);
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(freed->Await().ok());
}

TEST(BouncePoolTest, SmallTransfersGoThroughThePoolNotThePinnedPath) {
  auto rig = RegionOff();
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t max = TransferEngine::Config{}.bounce_max_bytes;
  std::vector<char> host(max + 1);
  EXPECT_EQ(engine.PathFor(host.data(), 4 * kKiB), TransferPath::kStaged);
  EXPECT_EQ(engine.PathFor(host.data(), max), TransferPath::kStaged);
  EXPECT_EQ(engine.PathFor(host.data(), max + 1), TransferPath::kPinned);
  const std::vector<uint64_t> sizes = {
      1, 4095, 4 * kKiB, 64 * kKiB + 3, 512 * kKiB, max};
  for (uint64_t n : sizes) {
    SCOPED_TRACE(n);
    std::vector<char> src = Pattern(n, static_cast<int>(n)), dst(n);
    RoundTrip(engine, src.data(), dst.data(), n);
    EXPECT_EQ(src, dst);
  }
  // Above the limit: pinned, as before.
  std::vector<char> big = Pattern(max + 1, 9), back(max + 1);
  RoundTrip(engine, big.data(), back.data(), max + 1);
  EXPECT_EQ(big, back);

  const TransferEngine::Stats s = engine.GetStats();
  EXPECT_EQ(s.staged_bounce, 2 * sizes.size());
  EXPECT_EQ(s.host[kH2d][kStaged].transfers, sizes.size());
  EXPECT_EQ(s.host[kD2h][kStaged].transfers, sizes.size());
  EXPECT_EQ(s.pinned_region_off, 2u);
  EXPECT_EQ(s.host[kH2d][kPinned].transfers, 1u);
  EXPECT_EQ(s.bounce_pool_bytes, TransferEngine::Config{}.bounce_pool_bytes);
  // Nothing of the caller's stays pinned, and no region staging was used.
  EXPECT_EQ(s.pinned_bytes_now, 0u);
  EXPECT_EQ(s.peak_staging_bytes, 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(BouncePoolTest, PoolIsLockedAndCountedAgainstMemlock) {
  auto rig = RegionOff();
  ASSERT_NE(rig, nullptr);
  const uint64_t pool = TransferEngine::Config{}.bounce_pool_bytes;
  // Locked once, at start-up: the OS layer holds exactly the pool locked.
  EXPECT_EQ(rig->os().locked_bytes(), pool);
  EXPECT_TRUE(rig->engine().GetStats().bounce_pool_locked);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(BouncePoolTest, NoPoolWithTheRegionOnOrWhenTurnedOff) {
  {
    absl::StatusOr<std::unique_ptr<TransferRig>> rig =
        TransferRig::Create({.region_bytes = 8 * kMiB});
    ASSERT_TRUE(rig.ok()) << rig.status();
    EXPECT_EQ((*rig)->engine().GetStats().bounce_pool_bytes, 0u);
  }
  TransferRig::Params params;
  params.engine.bounce_pool_bytes = 0;
  auto rig = RegionOff(params);
  ASSERT_NE(rig, nullptr);
  std::vector<char> host(4 * kKiB);
  EXPECT_EQ(rig->engine().PathFor(host.data(), host.size()),
            TransferPath::kPinned);
  EXPECT_EQ(rig->os().locked_bytes(), 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(BouncePoolTest, MisalignedBuffersOfAnySizeAreBounced) {
  TransferRig::Params params;
  params.host_alignment = 4;
  auto rig = RegionOff(params);
  ASSERT_NE(rig, nullptr);
  const uint64_t n = 3 * kMiB + 5;  // above the bounce limit
  std::vector<char> src(n + 8), dst(n + 8);
  const std::vector<char> pattern = Pattern(n, 3);
  std::memcpy(src.data() + 1, pattern.data(), n);
  RoundTrip(rig->engine(), src.data() + 1, dst.data() + 1, n);
  EXPECT_EQ(std::memcmp(dst.data() + 1, pattern.data(), n), 0);
  const TransferEngine::Stats s = rig->engine().GetStats();
  EXPECT_EQ(s.staged_bounce, 2u);
  EXPECT_EQ(s.staged_misaligned, 2u);
  EXPECT_EQ(rig->misaligned_dma(), 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(BouncePoolTest, ManyThreadsShareThePoolAndEveryByteArrives) {
  auto rig = RegionOff({.device_url = "sim://?devices=2&hbm=64M"});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  constexpr int kThreads = 6;
  constexpr int kRounds = 40;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        // From 4 KiB to the limit: several at once fill the 4 MiB pool,
        // and the rest wait for room.
        const uint64_t n = (uint64_t{4} << 10) << ((t + r) % 9);
        std::vector<char> src = Pattern(n, t * 100 + r), dst(n);
        RoundTrip(engine, src.data(), dst.data(), n, t % 2);
        if (src != dst) bad.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  const TransferEngine::Stats s = engine.GetStats();
  EXPECT_EQ(s.staged_bounce, 2u * kThreads * kRounds);
  EXPECT_EQ(s.host[kH2d][kStaged].transfers + s.host[kH2d][kPinned].transfers,
            uint64_t{kThreads} * kRounds);
  EXPECT_EQ(s.pinned_region_off, 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(BouncePoolTest, VlogOneSaysTheTransferWentThroughThePool) {
  testutil::ScopedTestLogging logs({{"engine_queues", 1}});
  auto rig = RegionOff();
  ASSERT_NE(rig, nullptr);
  std::vector<char> src = Pattern(4096, 1), dst(4096);
  RoundTrip(rig->engine(), src.data(), dst.data(), 4096);
  EXPECT_THAT(logs.File("INFO"),
              HasSubstr("takes the staged path (the premapped region is off: "
                        "through the engine's bounce pool"));
}

TEST(BouncePoolTest, PoolIsExcludedFromForkAndReleasedOnFailure) {
  Os* os = Os::Default();
  absl::StatusOr<std::unique_ptr<BouncePool>> pool =
      BouncePool::Create(os, 64 * kKiB, MlockMode::kOn);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE(IsExcludedFromFork((*pool)->base()));
  char* const base = (*pool)->base();
  pool->reset();
  EXPECT_FALSE(IsExcludedFromFork(base));

  // A failed fork advice is tolerated: the pool works, shared with
  // children, and says why.
  {
    absl::StatusOr<FaultSpec> parsed = ParseFaultSpec("madvise:nth=1");
    ASSERT_TRUE(parsed.ok());
    FaultInjector faults(*parsed);
    FaultInjectingOs fos(os, &faults);
    absl::StatusOr<std::unique_ptr<BouncePool>> p =
        BouncePool::Create(&fos, 64 * kKiB, MlockMode::kRequired);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_FALSE(IsExcludedFromFork((*p)->base()));
    EXPECT_THAT((*p)->fork_error().message(), HasSubstr("bounce pool"));
  }
  // Mapping or (TPUSHIM_MLOCK=required) locking failing: a named error,
  // nothing left.
  for (const char* spec : {"mmap:nth=1", "mlock:nth=1"}) {
    SCOPED_TRACE(spec);
    absl::StatusOr<FaultSpec> parsed = ParseFaultSpec(spec);
    ASSERT_TRUE(parsed.ok());
    FaultInjector faults(*parsed);
    FaultInjectingOs fos(os, &faults);
    absl::StatusOr<std::unique_ptr<BouncePool>> p =
        BouncePool::Create(&fos, 64 * kKiB, MlockMode::kRequired);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(p.status().message(), HasSubstr("bounce pool"));
    EXPECT_EQ(fos.mapped_bytes(), 0u);
    EXPECT_EQ(fos.locked_bytes(), 0u);
  }
  // With TPUSHIM_MLOCK=on a failed mlock leaves the pool working, unlocked.
  absl::StatusOr<FaultSpec> parsed = ParseFaultSpec("mlock:nth=1");
  FaultInjector faults(*parsed);
  FaultInjectingOs fos(os, &faults);
  absl::StatusOr<std::unique_ptr<BouncePool>> p =
      BouncePool::Create(&fos, 64 * kKiB, MlockMode::kOn);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE((*p)->locked());
  EXPECT_THAT((*p)->lock_error().message(), HasSubstr("injected"));
}

}  // namespace
}  // namespace tpushim
