// The transfer integrity suite: every path and direction through the
// public API, on whichever device TPUSHIM_TEST_DEVICE names — sim:// in the
// release job, `vfio://<bdf>?engine=nvme` inside the VM test
// (tests/vm/plans/vfio.sh) — with the same expectations on both. Sizes and
// offsets are whole device blocks (DeviceDescription::block_bytes) except
// where a test is about that rule.

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/log.h"
#include "tests/testing/temp_dir.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kRegion = 32 * kMiB;
constexpr uint64_t kThreshold = 4 * kMiB;

std::string TestDevice() {
  const char* device = std::getenv("TPUSHIM_TEST_DEVICE");
  return device != nullptr && *device != '\0' ? device : "sim://?hbm=64M";
}

bool IsVfio() { return absl::StartsWith(TestDevice(), "vfio://"); }

std::vector<char> Pattern(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = static_cast<char>(x);
  }
  return v;
}

class TransferIntegrityTest : public ::testing::Test {
 protected:
  void Start(const std::string& faults = "") {
    OptionOverrides o;
    o.device = TestDevice();
    o.premapped_buffer_size = kRegion;
    o.premapped_buffer_transfer_threshold_bytes = kThreshold;
    o.log_dir = Logs().path();
    o.stderr_log_level = 3;
    o.faults = faults;
    absl::StatusOr<std::unique_ptr<System>> system = System::Create(o);
    ASSERT_TRUE(system.ok()) << system.status();
    system_ = std::move(*system);
    block_ = system_->device(0).block_bytes;
  }

  // Whole blocks, at least `bytes`.
  uint64_t Blocks(uint64_t bytes) const {
    return (bytes + block_ - 1) / block_ * block_;
  }

  // Writes `data` to a new device buffer at `offset`, reads it back into a
  // separate buffer, and checks every byte.
  void RoundTrip(const char* src, char* dst, uint64_t n, TransferPath path) {
    ASSERT_EQ(system_->PathFor(src, n), path);
    absl::StatusOr<DeviceBuffer> buffer = system_->AllocateDevice(0, n);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    absl::StatusOr<Event> up = system_->TransferToDevice(src, *buffer, 0, n);
    ASSERT_TRUE(up.ok()) << up.status();
    absl::StatusOr<Event> down =
        system_->TransferFromDevice(*buffer, 0, dst, n, {*up});
    ASSERT_TRUE(down.ok()) << down.status();
    ASSERT_TRUE(down->Await().ok()) << down->Await();
    ASSERT_TRUE(up->Await().ok()) << up->Await();
    EXPECT_EQ(std::memcmp(src, dst, n), 0) << n << " bytes on " << TestDevice();
    absl::StatusOr<Event> freed = system_->Deallocate(*buffer);
    ASSERT_TRUE(freed.ok()) << freed.status();
    EXPECT_TRUE(freed->Await().ok());
  }

  // Three host-to-device transfers of 64 KiB into one buffer, one after
  // the other: returns their statuses (empty on a test failure), after
  // checking that the first and the last landed. For a fault in the middle.
  std::vector<absl::Status> ThreeTransfers() {
    const uint64_t n = Blocks(64 * 1024);
    absl::StatusOr<DeviceBuffer> buffer = system_->AllocateDevice(0, 3 * n);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return {};
    const std::vector<char> src = Pattern(3 * n, 7);
    std::vector<absl::Status> results;
    for (uint64_t i = 0; i < 3; ++i) {
      absl::StatusOr<Event> e =
          system_->TransferToDevice(src.data() + i * n, *buffer, i * n, n);
      EXPECT_TRUE(e.ok()) << e.status();
      if (!e.ok()) return {};
      results.push_back(e->Await());
    }
    std::vector<char> dst(3 * n);
    absl::StatusOr<Event> down =
        system_->TransferFromDevice(*buffer, 0, dst.data(), 3 * n);
    EXPECT_TRUE(down.ok() && down->Await().ok());
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), n), 0);
    EXPECT_EQ(std::memcmp(dst.data() + 2 * n, src.data() + 2 * n, n), 0);
    return results;
  }

  uint64_t PathTransfers(int direction, TransferPath path) {
    return system_->GetStats()
        .transfers.host[direction][static_cast<int>(path)]
        .transfers;
  }

  // Logging is set up once per process, by the first system: one directory
  // for the whole suite.
  static testutil::TempDir& Logs() {
    static testutil::TempDir* const logs = new testutil::TempDir;
    return *logs;
  }

  std::unique_ptr<System> system_;
  uint64_t block_ = 1;
};

TEST_F(TransferIntegrityTest, StagedRoundTripsOfManySizes) {
  ASSERT_NO_FATAL_FAILURE(Start());
  for (uint64_t n :
       {block_, Blocks(4096), Blocks(100'000), Blocks(1'500'000), kThreshold}) {
    std::vector<char> src = Pattern(n, 1);
    std::vector<char> dst(n);
    RoundTrip(src.data(), dst.data(), n, TransferPath::kStaged);
  }
  EXPECT_EQ(PathTransfers(0, TransferPath::kStaged), 5u);
  EXPECT_EQ(PathTransfers(1, TransferPath::kStaged), 5u);
}

TEST_F(TransferIntegrityTest, ZeroCopyRoundTripFromThePremappedRegion) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const uint64_t n = Blocks(3 * kMiB + 12345);
  absl::StatusOr<PinnedHostBuffer> a = system_->AllocatePinnedHost(n, 4096);
  absl::StatusOr<PinnedHostBuffer> b = system_->AllocatePinnedHost(n, 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<char> src = Pattern(n, 2);
  std::memcpy(a->data(), src.data(), n);
  RoundTrip(static_cast<char*>(a->data()), static_cast<char*>(b->data()), n,
            TransferPath::kZeroCopy);
  EXPECT_EQ(PathTransfers(0, TransferPath::kZeroCopy), 1u);
  EXPECT_EQ(PathTransfers(1, TransferPath::kZeroCopy), 1u);
}

TEST_F(TransferIntegrityTest, PinnedRoundTripAboveTheThreshold) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const uint64_t n = Blocks(5 * kMiB + 777);
  std::vector<char> src = Pattern(n, 3);
  std::vector<char> dst(n);
  RoundTrip(src.data(), dst.data(), n, TransferPath::kPinned);
  EXPECT_EQ(PathTransfers(0, TransferPath::kPinned), 1u);
  EXPECT_EQ(PathTransfers(1, TransferPath::kPinned), 1u);
  EXPECT_EQ(system_->GetStats().transfers.pinned_bytes_now, 0u);
}

TEST_F(TransferIntegrityTest,
       ConcurrentTransfersAtDifferentOffsetsKeepTheirBytes) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const uint64_t piece = Blocks(192 * 1024);
  const int pieces = 24;
  const uint64_t n = piece * pieces;
  absl::StatusOr<DeviceBuffer> buffer = system_->AllocateDevice(0, n);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const std::vector<char> src = Pattern(n, 4);
  std::vector<Event> ups;
  for (int i = 0; i < pieces; ++i) {
    absl::StatusOr<Event> e = system_->TransferToDevice(
        src.data() + i * piece, *buffer, i * piece, piece);
    ASSERT_TRUE(e.ok()) << e.status();
    ups.push_back(*e);
  }
  std::vector<char> dst(n);
  std::vector<Event> downs;
  for (int i = pieces - 1; i >= 0; --i) {
    absl::StatusOr<Event> e = system_->TransferFromDevice(
        *buffer, i * piece, dst.data() + i * piece, piece, ups);
    ASSERT_TRUE(e.ok()) << e.status();
    downs.push_back(*e);
  }
  for (Event& e : downs) ASSERT_TRUE(e.Await().ok()) << e.Await();
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), n), 0);
}

TEST_F(TransferIntegrityTest, DeviceToDeviceCopiesWithinTheDevice) {
  ASSERT_NO_FATAL_FAILURE(Start());
  for (uint64_t n : {block_, Blocks(70'000), Blocks(3 * kMiB + 1)}) {
    absl::StatusOr<DeviceBuffer> a = system_->AllocateDevice(0, n);
    absl::StatusOr<DeviceBuffer> b = system_->AllocateDevice(0, n);
    ASSERT_TRUE(a.ok() && b.ok());
    const std::vector<char> src = Pattern(n, 5);
    std::vector<char> dst(n);
    absl::StatusOr<Event> up = system_->TransferToDevice(src.data(), *a, 0, n);
    ASSERT_TRUE(up.ok()) << up.status();
    absl::StatusOr<Event> copy =
        system_->TransferDeviceToDevice(*a, 0, *b, 0, n, {*up});
    ASSERT_TRUE(copy.ok()) << copy.status();
    absl::StatusOr<Event> down =
        system_->TransferFromDevice(*b, 0, dst.data(), n, {*copy});
    ASSERT_TRUE(down.ok()) << down.status();
    ASSERT_TRUE(down->Await().ok()) << down->Await();
    EXPECT_EQ(std::memcmp(src.data(), dst.data(), n), 0) << n << " bytes";
  }
  EXPECT_EQ(system_->GetStats().transfers.device_to_device.failed, 0u);
}

TEST_F(TransferIntegrityTest, PartialBlocksAreRefusedByNameOnBlockDevices) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const uint64_t n = Blocks(8192);
  absl::StatusOr<DeviceBuffer> buffer = system_->AllocateDevice(0, n);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<char> src = Pattern(n, 6);
  absl::StatusOr<Event> odd_size =
      system_->TransferToDevice(src.data(), *buffer, 0, 100);
  absl::StatusOr<Event> odd_offset =
      system_->TransferToDevice(src.data(), *buffer, 4, block_);
  if (block_ == 1) {
    // Byte-addressed devices take any size and offset.
    ASSERT_TRUE(odd_size.ok()) << odd_size.status();
    ASSERT_TRUE(odd_offset.ok()) << odd_offset.status();
    EXPECT_TRUE(odd_size->Await().ok());
    EXPECT_TRUE(odd_offset->Await().ok());
    return;
  }
  for (const absl::StatusOr<Event>* e : {&odd_size, &odd_offset}) {
    ASSERT_FALSE(e->ok());
    EXPECT_EQ(e->status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(e->status().message()),
        HasSubstr(absl::StrCat("moves whole ", block_, "-byte blocks")));
  }
  // Nothing changed: the buffer still takes a whole-block transfer.
  absl::StatusOr<Event> good =
      system_->TransferToDevice(src.data(), *buffer, 0, n);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(good->Await().ok());
}

TEST_F(TransferIntegrityTest, DeviceMemoryExhaustionSpeaksXlasText) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const uint64_t hbm = system_->device(0).hbm_bytes;
  absl::StatusOr<DeviceBuffer> too_big =
      system_->AllocateDevice(0, hbm + block_);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      std::string(too_big.status().message()),
      HasSubstr("Error allocating device buffer: Attempting to allocate"));
  EXPECT_THAT(std::string(too_big.status().message()),
              HasSubstr("That was not possible. There are"));
}

TEST_F(TransferIntegrityTest, AnInjectedDmaFaultFailsThatTransferOnly) {
  ASSERT_NO_FATAL_FAILURE(Start("dma:nth=2"));
  const std::vector<absl::Status> results = ThreeTransfers();
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_EQ(results[1].code(), absl::StatusCode::kInternal) << results[1];
  EXPECT_THAT(std::string(results[1].message()),
              HasSubstr("[injected: dma:nth=2]"));
  EXPECT_TRUE(results[2].ok()) << results[2];
}

// On a device behind an IOMMU, the `iommu` fault point sends one command's
// DMA to an IOVA nothing is mapped at: the IOMMU blocks it for real, and
// only that transfer fails.
TEST_F(TransferIntegrityTest, DmaToAnUnmappedIovaFailsThatTransferOnly) {
  if (!IsVfio()) {
    GTEST_SKIP() << "the iommu fault point exists on vfio:// devices only";
  }
  ASSERT_NO_FATAL_FAILURE(Start("iommu:nth=2"));
  const std::vector<absl::Status> results = ThreeTransfers();
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_FALSE(results[1].ok());
  EXPECT_THAT(std::string(results[1].message()), HasSubstr("IOMMU blocked"));
  EXPECT_THAT(std::string(results[1].message()),
              HasSubstr("[injected: iommu:nth=2]"));
  EXPECT_TRUE(results[2].ok()) << results[2];
}

TEST_F(TransferIntegrityTest, StartupLogsLibtpusLinesInOrder) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(logging::FlushLogs());
  // The last start-up in the file is this test's.
  const std::string all =
      testutil::ReadFileOrEmpty(Logs().Join("tpu_driver.INFO"));
  const size_t last = all.rfind("TPU premapped buffer enabled. Size: ");
  ASSERT_NE(last, std::string::npos) << all;
  const std::string info = all.substr(all.rfind('\n', last) + 1);
  const std::vector<std::string> lines = {
      "TPU premapped buffer enabled. Size: ",
      "Creating numa aware allocators, number of NUMA nodes ",
      "Starting premapped memory manager initialization...",
      "Premapped buffer is using alignment 64",
      "Done premapping memory of size ",
      "Done allocating premapped memory of size ",
      "tpu::System initialized, current host id: 0, logical device ids: 0",
      "CreateTpuSystemState: TPU initialization is successful and it took ",
      "CreateTpuSystemState: using TPU host premapped buffer of size: ",
  };
  size_t at = 0;
  for (const std::string& line : lines) {
    const size_t found = info.find(line, at);
    ASSERT_NE(found, std::string::npos)
        << "missing or out of order: " << line << "\n"
        << info;
    at = found;
  }
  // Registering the region for the device's DMA (its IOMMU mapping on
  // vfio://) is part of premapping.
  const size_t mapped =
      info.find(absl::StrCat("Registered premapped memory of size ", kRegion,
                             " for DMA by ", system_->device(0).name, " in "));
  ASSERT_NE(mapped, std::string::npos) << info;
  EXPECT_LT(info.find("Starting premapped memory manager"), mapped);
  EXPECT_LT(mapped, info.find("Done premapping memory of size "));
}

}  // namespace
}  // namespace tpushim
