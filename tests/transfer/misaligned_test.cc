// Host buffers a device cannot DMA where they are (an NVMe controller's PRP
// entries are dword aligned: DeviceInfo::host_alignment 4) go through
// staging whatever their size, counted under their own reason; the device
// never sees a misaligned host address. The rig's devices state alignment
// 4 and count every descriptor that breaks it.

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::TransferRig;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr int kH2d = 0;
constexpr int kD2h = 1;

std::unique_ptr<TransferRig> Rig(
    uint64_t region_bytes, uint64_t threshold,
    absl::Duration staging_wait = absl::Seconds(10)) {
  TransferEngine::Config config;
  config.staging_wait = staging_wait;
  absl::StatusOr<std::unique_ptr<TransferRig>> rig =
      TransferRig::Create({.region_bytes = region_bytes,
                           .threshold = threshold,
                           .host_alignment = 4,
                           .engine = config});
  EXPECT_TRUE(rig.ok()) << rig.status();
  return rig.ok() ? *std::move(rig) : nullptr;
}

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 131 + seed);
  return v;
}

// Sends `n` bytes from `src` and reads them back into `dst`.
void RoundTrip(TransferEngine& engine, const char* src, char* dst, uint64_t n) {
  absl::StatusOr<DeviceBuffer> buffer = engine.Allocate(0, n);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  absl::StatusOr<Event> up = engine.TransferToDevice(src, *buffer, 0, n);
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<Event> down =
      engine.TransferFromDevice(*buffer, 0, dst, n, {*up});
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_TRUE(down->Await().ok());
  absl::StatusOr<Event> freed = engine.Deallocate(*buffer);
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(freed->Await().ok());
}

// 8 MiB, over the 1 MiB threshold: an aligned buffer would be pinned.
TEST(MisalignedTest, LargeMisalignedBuffersAreStagedAndCounted) {
  testutil::ScopedTestLogging logs;
  auto rig = Rig(16 * kMiB, 1 * kMiB);
  ASSERT_NE(rig, nullptr);
  const uint64_t n = 8 * kMiB;
  std::vector<char> src_storage = Pattern(n + 8, 5);
  std::vector<char> dst_storage(n + 8, 0);
  const char* src = src_storage.data() + 1;
  char* dst = dst_storage.data() + 3;
  EXPECT_EQ(rig->engine().PathFor(src, n), TransferPath::kStaged);
  RoundTrip(rig->engine(), src, dst, n);
  EXPECT_EQ(std::memcmp(src, dst, n), 0);
  const TransferEngine::Stats s = rig->engine().GetStats();
  EXPECT_EQ(s.staged_misaligned, 2u);
  EXPECT_EQ(s.pinned_over_threshold, 0u);
  EXPECT_EQ(s.host[kH2d][static_cast<int>(TransferPath::kStaged)].transfers,
            1u);
  EXPECT_EQ(s.host[kD2h][static_cast<int>(TransferPath::kStaged)].transfers,
            1u);
  EXPECT_EQ(rig->misaligned_dma(), 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
  // One WARNING (the second is within the rate limit), saying what and why.
  const std::string warnings = logs.File("WARNING");
  EXPECT_THAT(warnings, HasSubstr("Transfer of 8.00M host→device on sim:0 is "
                                  "staged whatever its size"));
  EXPECT_THAT(warnings, HasSubstr("is not 4-byte aligned"));
}

// The control: the same transfer from aligned buffers takes the pinned
// path, and the rig's count would see a misaligned address if one went by.
TEST(MisalignedTest, AlignedLargeBuffersStayPinned) {
  auto rig = Rig(16 * kMiB, 1 * kMiB);
  ASSERT_NE(rig, nullptr);
  const uint64_t n = 8 * kMiB;
  std::vector<char> src = Pattern(n, 6);
  std::vector<char> dst(n, 0);
  EXPECT_EQ(rig->engine().PathFor(src.data(), n), TransferPath::kPinned);
  RoundTrip(rig->engine(), src.data(), dst.data(), n);
  EXPECT_EQ(src, dst);
  const TransferEngine::Stats s = rig->engine().GetStats();
  EXPECT_EQ(s.staged_misaligned, 0u);
  EXPECT_EQ(s.pinned_over_threshold, 2u);
  EXPECT_EQ(rig->misaligned_dma(), 0u);
}

// A misaligned pointer into the premapped region would be zero-copy.
TEST(MisalignedTest, MisalignedRegionMemoryIsStagedNotZeroCopy) {
  auto rig = Rig(16 * kMiB, 0);
  ASSERT_NE(rig, nullptr);
  RegionAllocator& region = rig->region()->allocator();
  const uint64_t n = 2 * kMiB;
  char* src = static_cast<char*>(region.TryAllocate(n + 64));
  char* dst = static_cast<char*>(region.TryAllocate(n + 64));
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  const std::vector<char> pattern = Pattern(n, 7);
  std::memcpy(src + 2, pattern.data(), n);
  EXPECT_EQ(rig->engine().PathFor(src + 2, n), TransferPath::kStaged);
  EXPECT_EQ(rig->engine().PathFor(src, n), TransferPath::kZeroCopy);
  RoundTrip(rig->engine(), src + 2, dst + 1, n);
  EXPECT_EQ(std::memcmp(pattern.data(), dst + 1, n), 0);
  EXPECT_EQ(rig->engine().GetStats().staged_misaligned, 2u);
  EXPECT_EQ(rig->misaligned_dma(), 0u);
  ASSERT_TRUE(region.Free(src).ok());
  ASSERT_TRUE(region.Free(dst).ok());
}

// With the region off a misaligned buffer goes through the engine's
// bounce pool (bounce_pool_test.cc); with no pool either, it has no way.
TEST(MisalignedTest, WithTheRegionAndThePoolOffAMisalignedBufferIsRefused) {
  TransferEngine::Config config;
  config.bounce_pool_bytes = 0;
  absl::StatusOr<std::unique_ptr<TransferRig>> made = TransferRig::Create(
      {.region_bytes = 0, .host_alignment = 4, .engine = config});
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<TransferRig> rig = *std::move(made);
  absl::StatusOr<DeviceBuffer> buffer = rig->engine().Allocate(0, 4096);
  ASSERT_TRUE(buffer.ok());
  std::vector<char> host(4096 + 8);
  absl::StatusOr<Event> up =
      rig->engine().TransferToDevice(host.data() + 1, *buffer, 0, 4096);
  EXPECT_EQ(up.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(up.status().message()),
              AllOf(HasSubstr("is not 4-byte aligned"),
                    HasSubstr("TPU_PREMAPPED_BUFFER_SIZE=0")));
  // Refused before anything was held: the buffer frees at once.
  absl::StatusOr<Event> freed = rig->engine().Deallocate(*buffer);
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(freed->Await().ok());
  EXPECT_EQ(rig->misaligned_dma(), 0u);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

// With the region full of the application's buffers and no staging in
// flight to free room, a misaligned transfer has no way through: it fails
// with RESOURCE_EXHAUSTED saying why instead of waiting for ever.
TEST(MisalignedTest, NoStagingRoomAndNothingInFlightIsResourceExhausted) {
  auto rig = Rig(4 * kMiB, 0, absl::Milliseconds(50));
  ASSERT_NE(rig, nullptr);
  RegionAllocator& region = rig->region()->allocator();
  std::vector<void*> held;
  while (void* p = region.TryAllocate(64 << 10)) held.push_back(p);
  absl::StatusOr<DeviceBuffer> buffer = rig->engine().Allocate(0, kMiB);
  ASSERT_TRUE(buffer.ok());
  std::vector<char> host(kMiB + 8, 1);
  absl::StatusOr<Event> up =
      rig->engine().TransferToDevice(host.data() + 1, *buffer, 0, kMiB);
  ASSERT_TRUE(up.ok()) << up.status();
  const absl::Status s = up->Await();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("must be staged"));
  for (void* p : held) ASSERT_TRUE(region.Free(p).ok());
  EXPECT_EQ(rig->misaligned_dma(), 0u);
  // Staged by its size anyway, so not counted as rerouted.
  EXPECT_EQ(rig->engine().GetStats().staged_misaligned, 0u);
  EXPECT_EQ(rig->engine().GetStats().pinned_staging_timeout, 0u);
}

}  // namespace
}  // namespace tpushim
