// Simulated devices (`sim://`): the Device interface on host
// memory, so that everything above it runs — and is tested — on machines
// without an accelerator.
//
// Each device has
//  * HBM: an anonymous MAP_NORESERVE mapping of `hbm` bytes, so a 16 GiB
//    device costs host RAM only for the pages written; advised for
//    transparent huge pages (MADV_HUGEPAGE, after the fork advice), so a
//    page written is 2 MiB where the kernel has one to give; freeing a
//    device buffer of 64 MiB or more gives its whole pages back
//    (MADV_DONTNEED);
//  * a device-memory allocator (RegionAllocator, kDeviceMemory) whose
//    failures read as XLA's;
//  * a host-window table (ids carry a generation, so a stale id fails
//    instead of reaching a newer window);
//  * per direction, a power-of-two ring of descriptors served in order by
//    `dma_engines` DMA threads that memcpy between windows and HBM (device
//    to device between the HBMs of one SimCluster). Descriptors of 64 KiB
//    or more are copied with non-temporal stores (common/stream_copy.h),
//    as a DMA engine's writes to device memory or to a host buffer handed
//    back whole do not pass through the CPU's cache; device→host
//    descriptors marked `host_reads_next` (staging) and shorter ones are
//    copied through the cache.
//
// Link model (per device and direction, full duplex): with `link_gbps` > 0
// a descriptor of B bytes occupies the link for B * 8 / link_gbps ns,
// starting when the link is free; with `latency_us` it completes that much
// later. The copy itself happens as soon as an engine takes the
// descriptor; its completion is delivered at the modelled time, so the
// model — not the engine threads — sets the throughput. The arithmetic
// saturates (a time past the int64 range is never delivered by the model,
// not wrapped into the past); the URL parser bounds both settings.
// StopModelledDelays and Shutdown deliver every pending completion at once
// and time no later descriptor: a device being torn down does not sleep
// out model time.
//
// Fault point `dma` (FaultInjector) is checked once per descriptor; an
// injected fault completes it with the DMA error status (INTERNAL unless
// the rule names a code) and copies nothing.
//
// Idle DMA threads spin for a few microseconds before they sleep, so a
// descriptor submitted right after another starts without a wake-up. One
// submitted later waits for a thread to wake, unless the thread about to
// wait for it runs it itself (Poll: a device without the link model only).
//
// Thread-safety: as Device.

#ifndef TPUSHIM_DEVICE_SIM_SIM_DEVICE_H_
#define TPUSHIM_DEVICE_SIM_SIM_DEVICE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "device/device.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "env/os.h"

namespace tpushim {

struct SimDeviceOptions {
  // Descriptors per queue ring; a power of two in [1, 65536].
  uint32_t ring_entries = 1024;
  // How long an idle DMA thread polls for work before it sleeps.
  int64_t idle_spin_ns = 30'000;
};

// Creates the `url.devices` devices of a sim:// URL; they share one
// cluster (device-to-device copies reach any of them). `os` and `faults`
// (nullable) must outlive the devices. On error nothing stays mapped.
// `host_chips` picks the chips of the URL's host to create, in device
// order (each below `url.devices`); empty = every chip.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateSimDevices(
    const DeviceUrl& url, Os* os, FaultInjector* faults,
    SimDeviceOptions options = {}, std::vector<int> host_chips = {});

}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_SIM_SIM_DEVICE_H_
