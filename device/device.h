// The device interface: what the transfer engine needs from an accelerator,
// implemented by the simulated backend (device/sim/) and, later, by PCIe
// devices behind VFIO. Nothing above this interface knows which backend it
// drives.
//
// A device has
//  * an identity and capabilities (DeviceInfo);
//  * device memory ("HBM"), allocated and freed by address;
//  * host windows: ranges of host memory registered for DMA (the premapped
//    region once at start-up; a pinned caller range for the length of one
//    transfer), named in descriptors by window id + offset, as io_uring
//    names registered buffers;
//  * one DMA queue per direction: a power-of-two ring of fixed-width
//    descriptors (DmaDescriptor, 64 bytes). Submit() copies descriptors into
//    the ring and returns how many fit: a full ring is an ordinary return,
//    not an error. Each descriptor completes exactly once, echoing its
//    `user_data` to the completion sink with a status.
//
// Completion: the device calls DmaCompletionSink::OnDmaComplete on one of
// its own threads ("DMA threads"), or on the thread that called Poll(),
// holding none of its locks, so the sink may call Submit() again from
// inside. Descriptors of one queue start in ring order; with several DMA
// engines per direction they may complete out of order (a Poll() runs one
// only in an idle engine's place, so it changes nothing there).
//
// Thread-safety: every method is thread-safe. Shutdown() must not race with
// itself; after it returns, nothing calls the sink any more.
//
//   TPUSHIM_ASSIGN_OR_RETURN(HostWindowId w,
//                            device.RegisterHostWindow(base, size));
//   DmaDescriptor d{.user_data = 7, .length = n, .host_offset = 0,
//                   .device_address = addr, .host_window = w,
//                   .direction = DmaDirection::kHostToDevice};
//   if (device.Submit(DmaDirection::kHostToDevice, {&d, 1}) == 0) {
//     ... ring full: keep `d` and submit it after a completion ...
//   }

#ifndef TPUSHIM_DEVICE_DEVICE_H_
#define TPUSHIM_DEVICE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "allocator/region_allocator.h"
#include "tpushim/transfer.h"

namespace tpushim {

using HostWindowId = uint32_t;
inline constexpr HostWindowId kInvalidHostWindow = ~HostWindowId{0};

// One DMA operation. Fixed width (one cache line) so rings are arrays.
//  * kHostToDevice: copies `length` bytes from host window `host_window` at
//    `host_offset` to device memory at `device_address`.
//  * kDeviceToHost: copies from `device_address` to the host window.
//  * kDeviceToDevice: copies from `device_address` on this device to
//    `peer_address` on device `peer_device` (which may be this device;
//    ranges of it that overlap are copied as memmove copies them).
//    Descriptors in flight together may run at the same time, in any
//    order: ordering one descriptor's bytes against another's is the
//    submitter's job.
// `length` is at least 1. Ranges that fall outside the window or the
// device memory complete with OUT_OF_RANGE and copy nothing (as an IOMMU
// fault would).
struct alignas(64) DmaDescriptor {
  uint64_t user_data = 0;  // echoed in the completion
  uint64_t length = 0;
  uint64_t host_offset = 0;
  uint64_t device_address = 0;
  uint64_t peer_address = 0;
  HostWindowId host_window = kInvalidHostWindow;
  uint32_t peer_device = 0;
  DmaDirection direction = DmaDirection::kHostToDevice;
  // kDeviceToHost: the host reads these bytes next (a staging buffer the
  // engine copies out of), so a device that can steer its writes into the
  // host's cache (PCIe TLP processing hints) should; otherwise its writes
  // are the final copy and should not displace the cache. A hint: a device
  // may ignore it.
  bool host_reads_next = false;
};
static_assert(sizeof(DmaDescriptor) == 64);

struct DmaCompletion {
  uint64_t user_data = 0;
  // OK, or why the descriptor failed (OUT_OF_RANGE for a bad range, the
  // backend's transfer error or an injected `dma` fault, CANCELLED when the
  // device shut down before the descriptor started).
  absl::Status status;
  // When the device started and finished the descriptor (CLOCK_MONOTONIC
  // ns, as Os::MonotonicNanos); equal when it never started.
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// Receives completions. Implementations must be fast and must not block:
// they run on the device's DMA threads.
class DmaCompletionSink {
 public:
  virtual ~DmaCompletionSink() = default;
  virtual void OnDmaComplete(DmaDirection direction,
                             absl::Span<const DmaCompletion> completions) = 0;
};

struct DeviceInfo {
  int id = 0;                    // index in its system, 0 .. N-1
  std::string name;              // e.g. "sim:0"
  std::string backend;           // "sim"
  uint64_t hbm_bytes = 0;        // device memory capacity
  int dma_engines = 1;           // DMA engines per direction
  uint32_t ring_entries = 0;     // descriptors per queue ring (power of two)
  std::optional<int> numa_node;  // the host NUMA node the device sits on
  double link_gbps = 0;          // modelled link, 0 = unthrottled
  double latency_us = 0;         // modelled per-descriptor latency
  // The unit of device memory: device addresses and descriptor lengths
  // are multiples of it (1 for sim://, the logical block size for NVMe).
  uint32_t block_bytes = 1;
  // Host addresses the device can DMA are multiples of this (1 for sim://,
  // 4 for NVMe, whose PRP entries are dword aligned). A host buffer that is
  // not goes through staging, whose buffers always are.
  uint32_t host_alignment = 1;
  // Host memory a caller registers for DMA (System::RegisterHostMemory)
  // must start and end on multiples of this: 1 for sim://, the IOMMU page
  // (4096) for vfio://, which maps whole pages and would otherwise expose
  // the bytes around the range to the device.
  uint32_t window_alignment = 1;
  // The host chip it is (TPU_VISIBLE_CHIPS picks which; equal to `id`
  // when the process uses every chip of the host).
  int host_chip = 0;
};

// A device's memory as its allocator sees it.
struct DeviceMemoryStats {
  uint64_t capacity_bytes = 0;
  uint64_t bytes_in_use = 0;  // live allocations, each rounded to granule
  uint64_t free_bytes = 0;
  uint64_t largest_free_block = 0;
  // 1 - largest free block / free bytes; 0 when nothing is free.
  double fragmentation = 0.0;
  // An allocation of n bytes holds n rounded up to a multiple of this.
  uint64_t granule = 1;
};
// The stats of a device memory that a RegionAllocator manages.
DeviceMemoryStats DeviceMemoryStatsOf(const RegionAllocator::Stats& stats,
                                      uint64_t granule);

class Device {
 public:
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  virtual ~Device() = default;

  virtual const DeviceInfo& info() const = 0;

  // Where completions go. Must be called before the first Submit and not
  // while descriptors are in flight; `sink` must outlive the device's use
  // of it (until Shutdown returns).
  virtual void SetCompletionSink(DmaCompletionSink* sink) = 0;

  // ---- Device memory ------------------------------------------------------

  // Allocates `size` bytes (>= 1) of device memory, 64-byte aligned, and
  // returns its device address. RESOURCE_EXHAUSTED when it does not fit:
  //   Error allocating device buffer: Attempting to allocate 8.00M. That was
  //   not possible. There are 6.43M free.; (0x0x<id>_HBM0)
  // (XLA's wording), also logged at ERROR with the allocator's details.
  // INVALID_ARGUMENT for size 0.
  virtual absl::StatusOr<uint64_t> AllocateMemory(uint64_t size) = 0;
  // Frees an address AllocateMemory returned. INVALID_ARGUMENT (and no
  // change) for anything else. REQUIRES: no descriptor in flight uses it.
  virtual absl::Status FreeMemory(uint64_t device_address) = 0;
  // Bytes of device memory in use (each allocation rounded up to
  // DeviceMemoryStats::granule).
  virtual uint64_t MemoryInUse() const = 0;
  virtual DeviceMemoryStats GetMemoryStats() const = 0;

  // ---- Host windows -------------------------------------------------------

  // Makes [base, base + length) addressable by this device's DMA (an IOMMU
  // mapping on real hardware). The caller keeps the memory valid (and, for
  // real devices, pinned) until UnregisterHostWindow returns.
  // INVALID_ARGUMENT for a null base or a zero length.
  virtual absl::StatusOr<HostWindowId> RegisterHostWindow(const void* base,
                                                          uint64_t length) = 0;
  // INVALID_ARGUMENT for an id that is not registered. REQUIRES: no
  // descriptor in flight names the window.
  virtual absl::Status UnregisterHostWindow(HostWindowId window) = 0;

  // A window over memory that is still being populated (the premapped
  // region premapped behind the caller): registered now, but only its
  // first ExtendHostWindow() bytes are DMA'd; a device that maps host
  // memory (an IOMMU) maps it as it grows, so that mapping, which pins,
  // never touches pages not populated yet. Unregistered as any window.
  // The default registers the whole window at once, for devices that map
  // nothing.
  virtual absl::StatusOr<HostWindowId> ReserveHostWindow(const void* base,
                                                         uint64_t length) {
    return RegisterHostWindow(base, length);
  }
  // Makes the first `usable` bytes of a reserved window reachable by DMA
  // (increasing; the window's length at most). The default has nothing to
  // do. REQUIRES: calls for one window are not concurrent with each other
  // or with its UnregisterHostWindow.
  virtual absl::Status ExtendHostWindow(HostWindowId window, uint64_t usable) {
    (void)window;
    (void)usable;
    return absl::OkStatus();
  }

  // ---- DMA ----------------------------------------------------------------

  // Copies descriptors into the ring of `direction` in order, as many as
  // there is room for, and returns that count (0 when the ring is full or
  // the device is shut down: then each refused descriptor is simply not
  // accepted). Never blocks on the device.
  virtual size_t Submit(DmaDirection direction,
                        absl::Span<const DmaDescriptor> descriptors) = 0;

  // Descriptors accepted and not yet completed, in `direction`.
  virtual uint32_t InFlight(DmaDirection direction) const = 0;

  // Runs the next descriptor of `direction`'s ring on the calling thread,
  // if one waits there, is at most `max_length` bytes and an engine is
  // idle (the poll takes its place), and delivers its completion on this
  // thread too; returns whether it ran one. For a
  // thread about to wait for a small transfer: where a device's engines
  // are threads that may be asleep, waking one costs more than the copy
  // (on a virtual machine, tens of microseconds a wake-up). Returns false
  // where the engines cannot be helped: the default (hardware), a device
  // that models time (its engines keep it), a device shut down. The
  // caller holds no lock the completion sink takes.
  virtual bool Poll(DmaDirection direction, uint64_t max_length) {
    (void)direction;
    (void)max_length;
    return false;
  }

  // From now on a completion is delivered as soon as its descriptor has
  // run, without waiting out the time a device model still had for it
  // (sim://'s link and latency): called when the device's user shuts down,
  // which must not sleep out model time. A no-op for real hardware.
  // Idempotent; thread-safe.
  virtual void StopModelledDelays() {}

  // Stops the DMA engines: descriptors already started finish, the rest
  // complete with CANCELLED; every accepted descriptor has completed when
  // Shutdown returns, and Submit accepts nothing afterwards. Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_DEVICE_H_
