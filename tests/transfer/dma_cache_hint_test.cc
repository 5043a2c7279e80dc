// Which descriptors the engine marks host_reads_next: device→host
// descriptors whose bytes the host reads next (staging, which the engine
// copies out of) and no others, so that the simulated device streams the
// rest past the cache (device/sim/sim_device.h).

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using testutil::TransferRig;

constexpr uint64_t MiB = uint64_t{1} << 20;
constexpr int kH2d = static_cast<int>(DmaDirection::kHostToDevice);
constexpr int kD2h = static_cast<int>(DmaDirection::kDeviceToHost);

class DmaCacheHintTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Transfers up to 1 MiB are staged; larger ones outside the region
    // and outside a registration are pinned.
    auto rig = TransferRig::Create({.region_bytes = 16 * MiB,
                                    .threshold = MiB,
                                    .device_url = "sim://?hbm=64M",
                                    .count_descriptors = true});
    ASSERT_TRUE(rig.ok()) << rig.status();
    rig_ = *std::move(rig);
    auto b = rig_->engine().Allocate(0, 4 * MiB);
    ASSERT_TRUE(b.ok()) << b.status();
    buffer_ = *b;
  }

  // Runs one transfer and returns the descriptors it submitted.
  TransferRig::DescriptorCounts Run(bool h2d, void* host, uint64_t n,
                                    TransferPath path) {
    EXPECT_EQ(rig_->engine().PathFor(host, n), path);
    const TransferRig::DescriptorCounts before = rig_->descriptors();
    absl::StatusOr<Event> e =
        h2d ? rig_->engine().TransferToDevice(host, buffer_, 0, n)
            : rig_->engine().TransferFromDevice(buffer_, 0, host, n);
    EXPECT_TRUE(e.ok()) << e.status();
    if (e.ok()) {
      EXPECT_TRUE(e->Await().ok());
    }
    TransferRig::DescriptorCounts after = rig_->descriptors();
    for (int d = 0; d < 3; ++d) {
      after.plain[d] -= before.plain[d];
      after.host_reads_next[d] -= before.host_reads_next[d];
    }
    return after;
  }

  std::unique_ptr<TransferRig> rig_;
  DeviceBuffer buffer_;
};

TEST_F(DmaCacheHintTest, StagedDeviceToHostDescriptorsSayTheHostReadsNext) {
  std::vector<char> host(MiB);
  const TransferRig::DescriptorCounts c =
      Run(false, host.data(), host.size(), TransferPath::kStaged);
  EXPECT_GT(c.host_reads_next[kD2h], 0u);
  EXPECT_EQ(c.plain[kD2h], 0u);
}

TEST_F(DmaCacheHintTest, DirectDeviceToHostDescriptorsDoNot) {
  // Zero-copy from the region.
  absl::StatusOr<void*> pinned = rig_->region()->allocator().Allocate(MiB);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  TransferRig::DescriptorCounts c =
      Run(false, *pinned, MiB, TransferPath::kZeroCopy);
  EXPECT_GT(c.plain[kD2h], 0u);
  EXPECT_EQ(c.host_reads_next[kD2h], 0u);
  ASSERT_TRUE(rig_->region()->allocator().Free(*pinned).ok());

  // Pinned: over the threshold, outside the region.
  std::vector<char> big(4 * MiB);
  c = Run(false, big.data(), big.size(), TransferPath::kPinned);
  EXPECT_GT(c.plain[kD2h], 0u);
  EXPECT_EQ(c.host_reads_next[kD2h], 0u);

  // Zero-copy through a registration.
  absl::StatusOr<uint64_t> reg =
      rig_->engine().RegisterHostMemory(big.data(), big.size());
  ASSERT_TRUE(reg.ok()) << reg.status();
  c = Run(false, big.data(), big.size(), TransferPath::kZeroCopy);
  EXPECT_GT(c.plain[kD2h], 0u);
  EXPECT_EQ(c.host_reads_next[kD2h], 0u);
  EXPECT_TRUE(rig_->engine().UnregisterHostMemory(*reg).ok());
}

TEST_F(DmaCacheHintTest, HostToDeviceDescriptorsNeverDo) {
  std::vector<char> small(MiB, 1), big(4 * MiB, 2);
  for (const auto& [host, n, path] :
       {std::tuple{small.data(), small.size(), TransferPath::kStaged},
        std::tuple{big.data(), big.size(), TransferPath::kPinned}}) {
    const TransferRig::DescriptorCounts c = Run(true, host, n, path);
    EXPECT_GT(c.plain[kH2d], 0u);
    EXPECT_EQ(c.host_reads_next[kH2d], 0u);
  }
}

}  // namespace
}  // namespace tpushim
