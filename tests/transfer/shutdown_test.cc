// Shutdown lets transfers that have started finish — staged uploads and
// downloads, pinned pieces — so that a destroyed system never leaves a
// destination partly written behind an event that says CANCELLED. Only
// operations that have not started are cancelled. And they finish at the
// speed of the copies: no device model's link time is waited out.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using testutil::TransferRig;

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 31 + seed);
  return v;
}

// A throttled device (1 Gbit/s: 16 MiB take about 130 ms), so that a
// transfer is still running when shutdown comes.
std::unique_ptr<TransferRig> SlowRig(uint64_t region, uint64_t threshold = 0) {
  absl::StatusOr<std::unique_ptr<TransferRig>> rig = TransferRig::Create(
      {.region_bytes = region,
       .threshold = threshold,
       .device_url = "sim://?hbm=64M&link_gbps=1"});
  EXPECT_TRUE(rig.ok()) << rig.status();
  return rig.ok() ? *std::move(rig) : nullptr;
}

// Waits until `engine` has completed at least one descriptor of
// `direction`: the transfer has started.
void WaitUntilStarted(TransferEngine& engine, DmaDirection direction) {
  for (;;) {
    for (const auto& q : engine.GetStats().queues) {
      if (q.direction == direction && q.descriptors > 0) return;
    }
    std::this_thread::yield();
  }
}

TEST(ShutdownTest, StartedStagedUploadFinishes) {
  auto rig = SlowRig(64 * kMiB);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 16 * kMiB;
  std::vector<char> src = Pattern(n, 1);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(engine.PathFor(src.data(), n), TransferPath::kStaged);
  absl::StatusOr<Event> up = engine.TransferToDevice(src.data(), *b, 0, n);
  ASSERT_TRUE(up.ok());
  WaitUntilStarted(engine, DmaDirection::kHostToDevice);
  engine.Shutdown();
  EXPECT_TRUE(up->Await().ok()) << up->Await();
  EXPECT_EQ(engine.GetStats().host[0][1].bytes, n);
}

TEST(ShutdownTest, StartedStagedDownloadFinishesWithEveryByte) {
  auto rig = SlowRig(64 * kMiB);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 16 * kMiB;
  std::vector<char> src = Pattern(n, 2), dst(n, 0);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Event> up = engine.TransferToDevice(src.data(), *b, 0, n);
  ASSERT_TRUE(up.ok() && up->Await().ok());
  absl::StatusOr<Event> down = engine.TransferFromDevice(*b, 0, dst.data(), n);
  ASSERT_TRUE(down.ok());
  WaitUntilStarted(engine, DmaDirection::kDeviceToHost);
  engine.Shutdown();
  EXPECT_TRUE(down->Await().ok()) << down->Await();
  EXPECT_EQ(src, dst);
}

TEST(ShutdownTest, StartedPinnedTransferFinishesWithEveryByte) {
  // Above a 1 MiB threshold: pinned, in 4 MiB pieces.
  auto rig = SlowRig(8 * kMiB, kMiB);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 24 * kMiB;
  std::vector<char> src = Pattern(n, 3), dst(n, 0);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(engine.PathFor(src.data(), n), TransferPath::kPinned);
  absl::StatusOr<Event> up = engine.TransferToDevice(src.data(), *b, 0, n);
  ASSERT_TRUE(up.ok() && up->Await().ok());
  absl::StatusOr<Event> down = engine.TransferFromDevice(*b, 0, dst.data(), n);
  ASSERT_TRUE(down.ok());
  WaitUntilStarted(engine, DmaDirection::kDeviceToHost);
  engine.Shutdown();
  EXPECT_TRUE(down->Await().ok()) << down->Await();
  EXPECT_EQ(src, dst);
  EXPECT_EQ(rig->TearDownAndReport(), "");
}

TEST(ShutdownTest, ATransferStartedOnASlowModelledLinkFinishesAtOnce) {
  // 0.001 Gbit/s: each 512 KiB staged chunk holds the modelled link for
  // 4.2 s, 8 MiB for over a minute. Shutdown waits for none of it: the
  // transfer finishes at the speed of the copies.
  absl::StatusOr<std::unique_ptr<TransferRig>> made =
      TransferRig::Create({.region_bytes = 64 * kMiB,
                           .device_url = "sim://?hbm=64M&link_gbps=0.001"});
  ASSERT_TRUE(made.ok()) << made.status();
  TransferEngine& engine = (*made)->engine();
  const uint64_t n = 8 * kMiB;
  std::vector<char> src = Pattern(n, 4), dst(n, 0);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(engine.PathFor(src.data(), n), TransferPath::kStaged);
  absl::StatusOr<Event> up = engine.TransferToDevice(src.data(), *b, 0, n);
  ASSERT_TRUE(up.ok());
  // Started: its first chunks are in staging, on the modelled link.
  while (engine.GetStats().staging_bytes_in_flight == 0) {
    std::this_thread::yield();
  }
  const auto start = std::chrono::steady_clock::now();
  engine.Shutdown();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_TRUE(up->IsReady());
  EXPECT_TRUE(up->Await().ok()) << up->Await();
  EXPECT_EQ(engine.GetStats().host[0][1].bytes, n);
  // Far below the model's minute, and the 4.2 s of one chunk.
  EXPECT_LT(seconds, 2.0) << "shutdown waited out modelled link time";
}

}  // namespace
}  // namespace tpushim
