// The `vfio://<pci address>?engine=nvme` backend: the Device interface on
// an NVMe controller driven from user space through VFIO (device/vfio/),
// with namespace 1 playing the device's memory.
//
// Start-up (OpenNvmeDevice): VFIO open and function reset, bus mastering,
// BAR0, controller disable/enable (CC/CSTS, waiting at most CAP.TO),
// the admin queue, Identify Controller and Namespace, Set Features (Number
// of Queues), MSI-X vectors (one per queue; polling when the device has
// none or `irq=poll`), and one I/O submission/completion queue pair per
// DMA direction. Queue memory, PRP lists, Copy range descriptors and
// device-to-device bounce buffers live in one arena that is IOMMU-mapped
// once at start-up; nothing is mapped per command.
//
// Device memory: namespace 1, addressed in bytes. The controller moves
// whole logical blocks, so (DeviceInfo::block_bytes):
//  * device buffers start on a block boundary and take whole blocks;
//  * every descriptor's device address (and peer address) and length are
//    whole blocks, and its host address is 4-byte aligned (PRP entries are
//    dword aligned). Anything else completes with INVALID_ARGUMENT naming
//    the rule; the transfer engine refuses such transfers before that.
//
// DMA: host→device is Write, device→host is Read, device→device is Copy
// (one source range per command, within the namespace's MSSRL/MCL) when
// the controller supports it (ONCS bit 8) and `d2d=bounce` does not say
// otherwise, else Read into an arena bounce buffer then Write. Descriptors
// are split into commands of at most MDTS bytes; a descriptor completes
// when its last command does, with the first failure among them. A
// command's NVMe error becomes the descriptor's status (OUT_OF_RANGE for
// LBA Out of Range, INVALID_ARGUMENT for Invalid Field, else INTERNAL),
// naming the command, status code and LBA.
//
// Fault points: `dma` (per descriptor, as sim://: it fails without
// reaching the device) and `iommu` (per Read or Write command: its data
// pointers, and its PRP list pointer, are set to an IOVA nothing is mapped
// at, so the IOMMU blocks the controller's DMA and the command fails for
// real; on QEMU 7.2 only when the command has a PRP list, docs/vfio.md).
//
// Shutdown: descriptors whose commands have not started complete with
// CANCELLED; started ones finish, for at most CAP.TO, after which the
// controller is disabled (which aborts its commands) and they complete
// with ABORTED. Destruction disables the controller, resets the function
// and undoes every mapping.
//
// Thread-safety: as Device. One worker thread per direction issues
// commands and reaps completions; Submit issues directly when the
// submission queue has room.

#ifndef TPUSHIM_DEVICE_NVME_NVME_DEVICE_H_
#define TPUSHIM_DEVICE_NVME_NVME_DEVICE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "env/os.h"

namespace tpushim {

// How long the engine waits for an I/O command before it gives up on the
// controller (Linux's nvme io_timeout is 30 s too): the commands out fail
// DEADLINE_EXCEEDED, the controller is disabled to stop its DMA, and every
// later transfer fails at once until the device is reopened.
struct NvmeTuning {
  absl::Duration command_timeout = absl::Seconds(30);
};

// Opens the NVMe controller a `vfio://…?engine=nvme` URL names as device 0.
// `os` and `faults` (nullable) must outlive it. On error nothing stays open,
// mapped or enabled.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> OpenNvmeDevices(
    const DeviceUrl& url, Os* os, FaultInjector* faults,
    NvmeTuning tuning = {});

}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_NVME_NVME_DEVICE_H_
