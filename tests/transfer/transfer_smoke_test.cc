// Round trips on each path: the minimum every change must keep working.

#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/transfer_rig.h"

namespace tpushim {
namespace {

using testutil::TransferRig;

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 31 + seed);
  return v;
}

void RoundTrip(TransferRig& rig, const char* src, char* dst, uint64_t n,
               TransferPath expected) {
  TransferEngine& engine = rig.engine();
  EXPECT_EQ(engine.PathFor(src, n), expected);
  auto buffer = engine.Allocate(0, n);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto up = engine.TransferToDevice(src, *buffer, 0, n);
  ASSERT_TRUE(up.ok()) << up.status();
  auto down = engine.TransferFromDevice(*buffer, 0, dst, n, {*up});
  ASSERT_TRUE(down.ok()) << down.status();
  ASSERT_TRUE(down->Await().ok()) << down->Await();
  EXPECT_TRUE(up->IsReady());
  EXPECT_EQ(std::memcmp(src, dst, n), 0);
  auto freed = engine.Deallocate(*buffer, {*down});
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_TRUE(freed->Await().ok());
}

TEST(TransferSmokeTest, StagedRoundTrip) {
  auto rig = TransferRig::Create({});
  ASSERT_TRUE(rig.ok()) << rig.status();
  for (uint64_t n : {1ull, 4096ull, 3'000'001ull}) {
    std::vector<char> src = Pattern(n, 1), dst(n);
    RoundTrip(**rig, src.data(), dst.data(), n, TransferPath::kStaged);
  }
  auto s = (*rig)->engine().GetStats();
  EXPECT_EQ(s.host[0][static_cast<int>(TransferPath::kStaged)].transfers, 3u);
  EXPECT_EQ(s.host[1][static_cast<int>(TransferPath::kStaged)].transfers, 3u);
  EXPECT_EQ((*rig)->TearDownAndReport(), "");
}

TEST(TransferSmokeTest, ZeroCopyRoundTrip) {
  auto rig = TransferRig::Create({});
  ASSERT_TRUE(rig.ok()) << rig.status();
  const uint64_t n = 2'500'000;
  auto a = (*rig)->region()->allocator().Allocate(n);
  auto b = (*rig)->region()->allocator().Allocate(n);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<char> src = Pattern(n, 2);
  std::memcpy(*a, src.data(), n);
  RoundTrip(**rig, static_cast<char*>(*a), static_cast<char*>(*b), n,
            TransferPath::kZeroCopy);
  ASSERT_TRUE((*rig)->region()->allocator().Free(*a).ok());
  ASSERT_TRUE((*rig)->region()->allocator().Free(*b).ok());
  EXPECT_EQ((*rig)->TearDownAndReport(), "");
}

TEST(TransferSmokeTest, PinnedRoundTripAboveThreshold) {
  auto rig = TransferRig::Create({.threshold = 1 << 20});
  ASSERT_TRUE(rig.ok()) << rig.status();
  const uint64_t n = 3 << 20;
  std::vector<char> src = Pattern(n, 3), dst(n);
  RoundTrip(**rig, src.data(), dst.data(), n, TransferPath::kPinned);
  auto s = (*rig)->engine().GetStats();
  EXPECT_EQ(s.pinned_over_threshold, 2u);
  EXPECT_EQ(s.pinned_bytes_now, 0u);
  EXPECT_EQ((*rig)->TearDownAndReport(), "");
}

// The threshold is inclusive: a transfer of exactly the threshold is
// staged, one byte more is pinned.
TEST(TransferSmokeTest, TransferOfExactlyTheThresholdIsStaged) {
  auto rig = TransferRig::Create({.threshold = 1 << 20});
  ASSERT_TRUE(rig.ok()) << rig.status();
  std::vector<char> host((1 << 20) + 1);
  EXPECT_EQ((*rig)->engine().PathFor(host.data(), 1 << 20),
            TransferPath::kStaged);
  EXPECT_EQ((*rig)->engine().PathFor(host.data(), (1 << 20) + 1),
            TransferPath::kPinned);
}

// With the region off and no bounce pool, every transfer pins.
TEST(TransferSmokeTest, PinnedRoundTripRegionOff) {
  TransferEngine::Config config;
  config.bounce_pool_bytes = 0;
  auto rig = TransferRig::Create({.region_bytes = 0, .engine = config});
  ASSERT_TRUE(rig.ok()) << rig.status();
  const uint64_t n = 100'000;
  std::vector<char> src = Pattern(n, 4), dst(n);
  RoundTrip(**rig, src.data(), dst.data(), n, TransferPath::kPinned);
  EXPECT_EQ((*rig)->engine().GetStats().pinned_region_off, 2u);
  EXPECT_EQ((*rig)->TearDownAndReport(), "");
}

TEST(TransferSmokeTest, DeviceToDeviceAcrossDevices) {
  auto rig = TransferRig::Create({.device_url = "sim://?devices=2&hbm=16M"});
  ASSERT_TRUE(rig.ok()) << rig.status();
  TransferEngine& engine = (*rig)->engine();
  const uint64_t n = 5'000'000;
  std::vector<char> src = Pattern(n, 5), dst(n);
  auto a = engine.Allocate(0, n);
  auto b = engine.Allocate(1, n);
  ASSERT_TRUE(a.ok() && b.ok());
  auto up = engine.TransferToDevice(src.data(), *a, 0, n);
  ASSERT_TRUE(up.ok());
  auto copy = engine.TransferDeviceToDevice(*a, 0, *b, 0, n, {*up});
  ASSERT_TRUE(copy.ok());
  auto down = engine.TransferFromDevice(*b, 0, dst.data(), n, {*copy});
  ASSERT_TRUE(down.ok());
  ASSERT_TRUE(down->Await().ok()) << down->Await();
  EXPECT_EQ(src, dst);
  EXPECT_EQ((*rig)->TearDownAndReport(), "");
}

TEST(TransferSmokeTest, MoreDescriptorsThanRingSlotsWaitForRoom) {
  // 4 KiB chunks: an 8 MiB zero-copy transfer is 2048 descriptors, twice
  // the simulated ring; the rest wait in the engine's overflow.
  TransferEngine::Config config;
  config.chunk_bytes = 4096;
  config.from_device_chunk_bytes = 4096;
  config.descriptor_bytes = 4096;
  auto rig = TransferRig::Create(
      {.device_url = "sim://?hbm=32M&latency_us=20", .engine = config});
  ASSERT_TRUE(rig.ok()) << rig.status();
  TransferEngine& engine = (*rig)->engine();
  const uint64_t n = 8 << 20;
  auto host = (*rig)->region()->allocator().Allocate(n);
  ASSERT_TRUE(host.ok());
  std::vector<char> src = Pattern(n, 6);
  std::memcpy(*host, src.data(), n);
  auto buffer = engine.Allocate(0, n);
  ASSERT_TRUE(buffer.ok());
  auto up = engine.TransferToDevice(*host, *buffer, 0, n);
  ASSERT_TRUE(up.ok());
  std::vector<char> dst(n);
  auto down = engine.TransferFromDevice(*buffer, 0, dst.data(), n, {*up});
  ASSERT_TRUE(down.ok());
  ASSERT_TRUE(down->Await().ok()) << down->Await();
  EXPECT_EQ(src, dst);
  EXPECT_GT(engine.GetStats().queues[0].ring_full, 0u);
  ASSERT_TRUE((*rig)->region()->allocator().Free(*host).ok());
  EXPECT_EQ((*rig)->TearDownAndReport(), "");
}

}  // namespace
}  // namespace tpushim
