// What a `tpushim stress` worker (tools/stress/worker.h) expects and draws:
// which statuses count as expected failures for each kind of call and
// configuration, and the sizes it draws for transfers.

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tools/stress/worker.h"

namespace tpushim::tools::stress_internal {
namespace {

using Kind = Shared::Kind;

TEST(StressExpectedTest, RegionOffPinnedAllocationsFailWithFailedPrecondition) {
  Shared off;
  off.region = false;
  const absl::Status precondition = absl::FailedPreconditionError(
      "Cannot allocate a pinned host buffer: the premapped region is off");
  // The documented failure, and nothing else, not even success.
  EXPECT_TRUE(off.Expected(precondition, Kind::kPinnedAllocation));
  EXPECT_FALSE(off.Expected(absl::OkStatus(), Kind::kPinnedAllocation));
  EXPECT_FALSE(off.Expected(absl::ResourceExhaustedError("full"),
                            Kind::kPinnedAllocation));
  off.faults = true;
  EXPECT_TRUE(off.Expected(precondition, Kind::kPinnedAllocation));
  EXPECT_FALSE(off.Expected(absl::OkStatus(), Kind::kPinnedAllocation));
  // Device memory and transfers do not depend on the region.
  EXPECT_FALSE(off.Expected(precondition, Kind::kAllocation));
  EXPECT_FALSE(off.Expected(precondition, Kind::kOperation));
  EXPECT_TRUE(off.Expected(absl::OkStatus(), Kind::kAllocation));
}

TEST(StressExpectedTest, RegionOnPinnedAllocationsFailOnlyWhenFull) {
  Shared on;
  EXPECT_TRUE(on.Expected(absl::OkStatus(), Kind::kPinnedAllocation));
  EXPECT_TRUE(on.Expected(absl::ResourceExhaustedError("full"),
                          Kind::kPinnedAllocation));
  EXPECT_FALSE(on.Expected(absl::FailedPreconditionError("off"),
                           Kind::kPinnedAllocation));
  EXPECT_FALSE(on.Expected(absl::InternalError("x [injected: alloc:nth=1]"),
                           Kind::kPinnedAllocation));
  on.faults = true;
  EXPECT_TRUE(on.Expected(absl::InternalError("x [injected: alloc:nth=1]"),
                          Kind::kPinnedAllocation));
  EXPECT_FALSE(on.Expected(absl::InternalError("x"), Kind::kPinnedAllocation));
}

// A transfer into part of a buffer is drawn log-uniform over [1, capacity]:
// about half of the sizes into a 1 MiB buffer are 1 KiB or more, and some
// come close to the whole buffer. (The draw once used 50 bits where
// LogUniform reads 53, which kept every partial transfer under 6 bytes.)
TEST(StressPlanningTest, PartialTransferSizesSpanTheBuffer) {
  constexpr uint64_t kCapacity = uint64_t{1} << 20;
  std::mt19937_64 rng(7);
  int whole = 0;
  int partial = 0;
  int at_least_1k = 0;
  uint64_t largest = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t r1 = rng();
    const uint64_t r2 = rng();
    const auto [size, offset] = SizeAndOffset(kCapacity, r1, r2, 1);
    ASSERT_GE(size, 1u);
    ASSERT_LE(offset + size, kCapacity);
    if (size == kCapacity) {
      ++whole;
      continue;
    }
    ++partial;
    if (size >= 1024) ++at_least_1k;
    largest = std::max(largest, size);
  }
  EXPECT_NEAR(whole / 20000.0, 1.0 / 8, 0.02);
  EXPECT_NEAR(static_cast<double>(at_least_1k) / partial, 0.5, 0.05);
  EXPECT_GT(largest, kCapacity / 2);
  // Whole blocks when the device has them.
  for (int i = 0; i < 1000; ++i) {
    const auto [size, offset] = SizeAndOffset(512 * 64, rng(), rng(), 512);
    EXPECT_EQ(size % 512, 0u);
    EXPECT_EQ(offset % 512, 0u);
  }
}

}  // namespace
}  // namespace tpushim::tools::stress_internal
