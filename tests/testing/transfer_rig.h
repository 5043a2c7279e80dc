// Test helper: a premapped region, simulated devices and a transfer engine,
// built from a few numbers and isolated from the test process's
// environment (no TPU_* or TPUSHIM_* variable leaks in).
//
//   auto rig = TransferRig::Create({.region_bytes = 8 << 20,
//                                   .device_url = "sim://?devices=2"});
//   ASSERT_TRUE(rig.ok()) << rig.status();
//   TransferEngine& engine = (*rig)->engine();
//
// Everything goes through a FaultInjectingOs, so a test can inject faults
// (rig->faults()) and check that nothing stays mapped, locked or pinned.
// Users link tpushim_transfer_testing.

#ifndef TPUSHIM_TESTS_TESTING_TRANSFER_RIG_H_
#define TPUSHIM_TESTS_TESTING_TRANSFER_RIG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/premapped_region.h"
#include "device/device.h"
#include "env/fault_injection.h"
#include "env/os.h"
#include "transfer/transfer_engine.h"

namespace tpushim::testutil {

class TransferRig {
 public:
  struct Params {
    // TPU_PREMAPPED_BUFFER_SIZE; 0 = region off.
    uint64_t region_bytes = uint64_t{16} << 20;
    // TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES; 0 = the size.
    uint64_t threshold = 0;
    std::string device_url = "sim://?hbm=64M";
    // TPUSHIM_FAULTS spec, e.g. "dma:nth=3".
    std::string faults{};
    // > 1: every device states this host alignment (as NVMe states 4) and
    // counts the descriptors whose host address breaks it
    // (misaligned_dma()), which must then never happen.
    uint32_t host_alignment = 1;
    // > 1: every device states that it moves whole blocks of this size
    // (as NVMe states its logical block): device buffers and the offsets
    // and sizes of transfers are multiples of it.
    uint32_t block_bytes = 1;
    // > 1: every device states that registered host memory must lie on
    // multiples of this (as vfio:// states its IOMMU page).
    uint32_t window_alignment = 1;
    // Wraps the devices (as the three above do) to count descriptors by
    // direction and DmaDescriptor::host_reads_next (descriptors()).
    bool count_descriptors = false;
    // The test's own wrapper of each device (after the ones above).
    std::function<std::unique_ptr<Device>(std::unique_ptr<Device>)>
        wrap_device{};
    // Opens the devices instead of `device_url` (which still sets the
    // options): e.g. NVMe devices over a fake controller, whose OS layer
    // the test owns and keeps alive until the rig is gone.
    std::function<absl::StatusOr<std::vector<std::unique_ptr<Device>>>()>
        open_devices{};
    TransferEngine::Config engine{};
    // TPUSHIM_MEMORY_PROFILE: opened for the devices before the engine
    // starts, as System::Create does; "" = none.
    std::string memory_profile{};
  };

  static absl::StatusOr<std::unique_ptr<TransferRig>> Create(Params params);
  TransferRig(const TransferRig&) = delete;
  TransferRig& operator=(const TransferRig&) = delete;
  // Shuts the engine down, closes the devices, unmaps the region.
  ~TransferRig();

  TransferEngine& engine() { return *engine_; }
  PremappedRegion* region() { return region_.get(); }  // null when off
  Device& device(int i) { return *devices_[i]; }
  FaultInjector& faults() { return *faults_; }
  // Descriptors whose host address broke Params::host_alignment.
  uint64_t misaligned_dma() const;
  // Descriptors submitted to the wrapped devices so far, by direction
  // (DmaDirection as an index) and whether they said host_reads_next.
  struct DescriptorCounts {
    uint64_t plain[3] = {0, 0, 0};
    uint64_t host_reads_next[3] = {0, 0, 0};
  };
  DescriptorCounts descriptors() const;
  // The host windows (base, length) registered with `device` now, when
  // the devices are wrapped (host_alignment, block_bytes or
  // window_alignment > 1, or count_descriptors); empty otherwise.
  std::vector<std::pair<const void*, uint64_t>> HostWindows(int device);
  FaultInjectingOs& os() { return *os_; }

  // Shuts down and destroys the engine, then the devices and the region,
  // and returns what the OS layer still holds ("" when nothing): e.g.
  // "pinned 4096 bytes". The rig is unusable afterwards.
  std::string TearDownAndReport();

 private:
  TransferRig() = default;

  std::unique_ptr<Os> env_os_;  // real OS with an empty environment
  std::unique_ptr<FaultInjector> faults_;
  std::unique_ptr<FaultInjectingOs> os_;
  std::unique_ptr<PremappedRegion> region_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::unique_ptr<TransferEngine> engine_;
  std::shared_ptr<std::atomic<uint64_t>> misaligned_dma_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::mutex> counts_mu_ = std::make_shared<std::mutex>();
  std::shared_ptr<DescriptorCounts> counts_ =
      std::make_shared<DescriptorCounts>();
};

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_TRANSFER_RIG_H_
