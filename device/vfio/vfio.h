// A PCI function driven from user space through VFIO (Linux's
// Documentation/driver-api/vfio.rst): the generic layer under every
// `vfio://` engine. It knows PCI and the IOMMU, nothing of the device
// class; device/nvme/ builds an NVMe controller on it.
//
// VfioDevice::Open walks the whole set-up, each step through the Os layer
// (fault point `vfio` fails any of its ioctls), and names what is wrong
// with the host when a step cannot be taken:
//   1. the PCI function exists, is bound to vfio-pci, and has an IOMMU
//      group (no group: the IOMMU is off on the kernel command line);
//   2. /dev/vfio/vfio and /dev/vfio/<group> open (permissions), the API
//      version and the TYPE1v2 IOMMU are there;
//   3. the group is viable: every other device in it is bound to vfio-pci
//      or to no driver (the message lists the ones that are not);
//   4. a container with the TYPE1v2 IOMMU, its usable IOVA ranges and its
//      limit on DMA mappings;
//   5. the device descriptor, its regions and interrupts; a function reset
//      when the device supports one.
// Each step is undone when a later one fails; the destructor undoes them
// all: it unmaps every IOMMU mapping still in place, turns interrupts off,
// resets the function, unmaps the BARs and closes the descriptors.
//
// IOMMU mappings (VFIO_IOMMU_MAP_DMA) pin the pages they map and charge
// them to RLIMIT_MEMLOCK (VmLck) unless the process has CAP_IPC_LOCK;
// MapDma checks that limit first and names it. IOVAs come from IovaSpace:
// the IOMMU's usable ranges (reserved windows such as the MSI range left
// out), capped at the device's DMA mask, minus one guard page that is
// never mapped (`unmapped_iova()`: DMA there is blocked by the IOMMU).
//
// Thread-safety: MapDma/UnmapDma are thread-safe; the rest is set up by one
// thread before the device is shared.
//
//   TPUSHIM_ASSIGN_OR_RETURN(PciAddress pci,
//   PciAddress::Parse("0000:01:00.0"));
//   TPUSHIM_ASSIGN_OR_RETURN(std::unique_ptr<VfioDevice> dev,
//                            VfioDevice::Open(pci, os, {}));
//   TPUSHIM_RETURN_IF_ERROR(dev->EnableBusMastering());
//   TPUSHIM_ASSIGN_OR_RETURN(VfioDevice::Bar bar0, dev->MapBar(0));
//   TPUSHIM_ASSIGN_OR_RETURN(uint64_t iova, dev->MapDma(buffer, bytes));

#ifndef TPUSHIM_DEVICE_VFIO_VFIO_H_
#define TPUSHIM_DEVICE_VFIO_VFIO_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "env/device_url.h"
#include "env/os.h"

namespace tpushim {

// IOVA allocation over the usable ranges of an IOMMU, in whole IOMMU pages,
// first fit from the bottom. Not thread-safe (VfioDevice locks it).
class IovaSpace {
 public:
  // [first, last], both inclusive, as VFIO reports them.
  struct Range {
    uint64_t first = 0;
    uint64_t last = 0;
  };
  // `page` is a power of two. Ranges are clipped to whole pages; the first
  // page of the lowest range is set aside as the guard page.
  IovaSpace(const std::vector<Range>& usable, uint64_t page);

  // `bytes` rounded up to whole pages. RESOURCE_EXHAUSTED when no free
  // range is large enough.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes);
  // Gives back what Allocate returned (same rounded size).
  void Free(uint64_t iova, uint64_t bytes);

  uint64_t page() const { return page_; }
  uint64_t free_bytes() const;
  // An IOVA inside the usable space that is never allocated.
  uint64_t guard_page() const { return guard_; }

 private:
  uint64_t RoundUp(uint64_t bytes) const {
    return (bytes + page_ - 1) & ~(page_ - 1);
  }

  uint64_t page_;
  uint64_t guard_ = 0;
  std::map<uint64_t, uint64_t> free_;  // begin -> end (exclusive)
};

class VfioDevice {
 public:
  struct Options {
    // Address bits the device can put on the bus; IOVAs stay below 2^bits.
    int dma_address_bits = 64;
    // Reset the function at open and at close (when it supports a reset).
    bool reset = true;
  };

  // A mapped BAR: `size` bytes of MMIO at `base`.
  struct Bar {
    volatile uint8_t* base = nullptr;
    uint64_t size = 0;
  };

  // What MapDma reports as it goes, for long mappings: bytes done so far.
  using Progress = std::function<void(uint64_t done, uint64_t total)>;

  static absl::StatusOr<std::unique_ptr<VfioDevice>> Open(
      const PciAddress& address, Os* os, const Options& options);

  VfioDevice(const VfioDevice&) = delete;
  VfioDevice& operator=(const VfioDevice&) = delete;
  ~VfioDevice();

  const PciAddress& address() const { return address_; }
  std::string name() const { return address_.ToString(); }
  int iommu_group() const { return group_number_; }
  uint16_t vendor_id() const { return vendor_id_; }
  uint16_t device_id() const { return device_id_; }
  // The PCI class code (base, sub-class, interface), e.g. 0x010802 for NVMe.
  uint32_t class_code() const { return class_code_; }
  // The host NUMA node the device sits on, if the kernel knows it.
  std::optional<int> numa_node() const { return numa_node_; }
  // Whether Open reset the function (it supports VFIO_DEVICE_RESET).
  bool can_reset() const { return can_reset_; }

  // ---- Config space and BARs -----------------------------------------------

  absl::StatusOr<uint16_t> ReadConfig16(uint32_t offset);
  absl::StatusOr<uint32_t> ReadConfig32(uint32_t offset);
  absl::Status WriteConfig16(uint32_t offset, uint16_t value);
  // Sets Memory Space and Bus Master Enable in the command register: without
  // bus mastering the device's DMA goes nowhere.
  absl::Status EnableBusMastering();
  // mmaps BAR `index` (0..5). The mapping lives as long as the device.
  // FAILED_PRECONDITION when the BAR is absent or cannot be mmapped.
  absl::StatusOr<Bar> MapBar(int index);

  // ---- Interrupts
  // -------------------------------------------------------------

  // MSI-X vectors the device offers (0: none, or not through VFIO).
  uint32_t msix_vectors() const { return msix_vectors_; }
  // Routes MSI-X vectors 0..count-1 to new eventfds and returns them (owned
  // by the device; they stay valid until DisableMsix or destruction).
  absl::StatusOr<std::vector<int>> EnableMsix(uint32_t count);
  void DisableMsix();

  // ---- IOMMU
  // ------------------------------------------------------------------

  uint64_t iova_page() const { return iova_page_; }
  // Maps [vaddr, vaddr + length) for the device's DMA and returns its IOVA.
  // `vaddr` and `length` must be whole IOMMU pages (INVALID_ARGUMENT).
  // Maps in chunks of `chunk` bytes (0: one call), reporting progress
  // after each. FAILED_PRECONDITION naming the limit when RLIMIT_MEMLOCK
  // cannot cover the pages; RESOURCE_EXHAUSTED when the IOVA space or the
  // IOMMU's mapping count is used up. On error nothing stays mapped.
  absl::StatusOr<uint64_t> MapDma(const void* vaddr, uint64_t length,
                                  uint64_t chunk = 0,
                                  const Progress& progress = nullptr);
  // A mapping that grows (memory populated behind the caller, which must
  // not be pinned before it is): ReserveDma takes the IOVA range for
  // [vaddr, vaddr + length) and maps nothing; GrowDma maps it up to its
  // first `mapped` bytes (rounded up to IOMMU pages, at most `length`),
  // one MAP_DMA per call. Checks and errors as MapDma's (ReserveDma checks
  // the memlock limit for the whole length); a failed GrowDma leaves the
  // mapping as it was. UnmapDma(iova, length) undoes the whole.
  // REQUIRES: GrowDma calls of one mapping are not concurrent with each
  // other or with its UnmapDma.
  absl::StatusOr<uint64_t> ReserveDma(const void* vaddr, uint64_t length);
  absl::Status GrowDma(uint64_t iova, uint64_t mapped);
  // Undoes one MapDma or ReserveDma (same iova and length).
  absl::Status UnmapDma(uint64_t iova, uint64_t length);
  // An IOVA in the device's address space that nothing is mapped at: DMA to
  // it is blocked by the IOMMU.
  uint64_t unmapped_iova() const { return iova_guard_; }
  // Bytes mapped into the IOMMU right now.
  uint64_t mapped_bytes() const;

  // VFIO_DEVICE_RESET (a function-level reset or what the kernel has).
  absl::Status Reset();

 private:
  VfioDevice(const PciAddress& address, Os* os);
  absl::Status Setup(const Options& options);
  absl::Status CheckHost();
  absl::Status CheckMemlock(uint64_t more_bytes);
  // INVALID_ARGUMENT unless both are whole IOMMU pages (length >= 1).
  absl::Status CheckWholePages(const void* vaddr, uint64_t length) const;

  const PciAddress address_;
  Os* const os_;
  int container_fd_ = -1;
  int group_fd_ = -1;
  int device_fd_ = -1;
  int group_number_ = -1;
  bool reset_on_close_ = false;
  bool can_reset_ = false;
  uint16_t vendor_id_ = 0;
  uint16_t device_id_ = 0;
  uint32_t class_code_ = 0;
  std::optional<int> numa_node_;
  uint64_t config_offset_ = 0;
  uint32_t msix_vectors_ = 0;
  std::vector<int> msix_fds_;
  std::vector<Bar> bars_;
  uint64_t iova_page_ = 4096;
  uint64_t iova_guard_ = 0;
  uint32_t dma_mappings_left_ = ~0u;  // VFIO's per-container limit

  struct Mapping {
    uint64_t length = 0;
    uint64_t entries = 0;  // MAP_DMA calls: the kernel's entries it holds
    // A growing mapping (ReserveDma): its address and how much of it is
    // mapped so far (all of it for MapDma).
    uintptr_t vaddr = 0;
    uint64_t mapped = 0;
  };

  mutable Mutex mu_;
  std::unique_ptr<IovaSpace> iova_ ABSL_GUARDED_BY(mu_);
  // Every live MapDma, by IOVA.
  std::map<uint64_t, Mapping> mappings_ ABSL_GUARDED_BY(mu_);
  uint64_t mapped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The kernel's DMA entries held or reserved (at most dma_mappings_left_).
  uint64_t dma_entries_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_VFIO_VFIO_H_
