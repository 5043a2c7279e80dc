// tpushim::System — the runtime: one call brings up everything a framework
// backend needs, in libtpu's order:
//
//   options (the environment, LIBTPU_INIT_ARGS, then what the caller sets)
//   → logging → host checks → premapped region → devices → transfer engine
//
// logging the start-up lines tools grep for, ending with (verbatim)
// clang-format off
//   tpu::System initialized, current host id: 0, logical device ids: 0,1,2,3
//   CreateTpuSystemState: TPU initialization is successful and it took 0.412345678s
//   CreateTpuSystemState: using TPU host premapped buffer of size: 4294967296
// clang-format on
//
// Several systems may live in one process (each with its own region,
// devices and engine); logging is process-wide: the first System started
// while logging is not initialized sets it up from its options, and later
// ones use it as it is.
//
// Destroying a System stops premapping the region if that goes on behind
// the caller (TPUSHIM_PREMAP=background), cancels operations that have
// not started, lets started ones finish, and releases every device
// buffer, staging buffer, pin and the region. REQUIRES: every PinnedHostBuffer
// of the system is destroyed first (its memory is part of the region).
//
// Thread-safety: all methods are thread-safe.
//
// fork(): the region, the bounce pool and the devices' memory are not
// inherited by a child (MADV_DONTFORK), so the parent's region never turns
// copy-on-write. In the child their addresses are reserved with no access:
// touching a PinnedHostBuffer inherited from the parent raises SIGSEGV.
// On a System inherited by a child, every call that allocates, transfers,
// deallocates or waits (and Await of a pending event) returns
// FAILED_PRECONDITION naming both processes; GetStats returns empty
// statistics; the device descriptions answer from the copy; destroying
// it there frees nothing of the parent's and returns at once. A child that needs the runtime creates its
// own System.
//
//   TPUSHIM_ASSIGN_OR_RETURN(std::unique_ptr<tpushim::System> system,
//                            tpushim::System::Create());
//   TPUSHIM_ASSIGN_OR_RETURN(tpushim::PinnedHostBuffer host,
//                            system->AllocatePinnedHost(n));
//   TPUSHIM_ASSIGN_OR_RETURN(tpushim::DeviceBuffer dev,
//                            system->AllocateDevice(0, n));
//   TPUSHIM_ASSIGN_OR_RETURN(tpushim::Event up,
//       system->TransferToDevice(host.data(), dev, 0, n));
//   TPUSHIM_RETURN_IF_ERROR(up.Await());

#ifndef TPUSHIM_SYSTEM_H_
#define TPUSHIM_SYSTEM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "tpushim/export.h"
#include "tpushim/options.h"
#include "tpushim/stats.h"
#include "tpushim/transfer.h"

namespace tpushim {

class System;

// A buffer from the premapped region: host memory devices DMA to and from
// directly (the zero-copy path), like libtpu's "pinned host" allocations.
// Move-only; returns its memory to the region when destroyed or Reset.
class TPUSHIM_EXPORT PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  ~PinnedHostBuffer();

  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }
  // Returns the memory to the region now.
  void Reset();

 private:
  friend class System;
  struct Owner;
  PinnedHostBuffer(std::shared_ptr<Owner> owner, void* data, uint64_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}

  std::shared_ptr<Owner> owner_;
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

// What a device is.
struct DeviceDescription {
  int id = 0;
  std::string name;     // "sim:0", "vfio:0000:01:00.0"
  std::string backend;  // "sim", "vfio-nvme"
  uint64_t hbm_bytes = 0;
  int dma_engines = 1;
  std::optional<int> numa_node;
  double link_gbps = 0;
  double latency_us = 0;
  // Device buffer offsets and transfer sizes are multiples of this (1 for
  // sim://; the logical block size, e.g. 512, for NVMe).
  uint32_t block_bytes = 1;
  // The host chip this device is (TPU_VISIBLE_CHIPS), which other
  // processes and `tpushim info` call it.
  int host_chip = 0;
};

// How far start-up has come, for a progress bar: premapping a large
// region (pre-faulting, pinning) is what takes seconds.
struct StartupProgress {
  enum class Phase {
    kPremapping,  // done_bytes of total_bytes of the region populated
    // The end: of start-up (successfully or not), or of premapping behind
    // the caller (TPUSHIM_PREMAP=background). done_bytes < total_bytes
    // then says the region is not all premapped: premapping failed
    // (AwaitPremapped says why), was stopped by destroying the system, or
    // still goes on behind Create (the last call of a callback that was
    // not asked to go on, see StartupProgressUntil).
    kDone,
  };
  Phase phase = Phase::kPremapping;
  uint64_t done_bytes = 0;
  uint64_t total_bytes = 0;  // the region's size (0 when it is off)
  absl::Duration elapsed;    // since Create was called

  // kDone with the whole region premapped (or no region): every byte of it
  // serves. False while premapping goes on or when it stopped short.
  bool complete() const {
    return phase == Phase::kDone && done_bytes == total_bytes;
  }
};
// Called from one runtime thread at a time, never concurrently, at most
// about 20 times a second and once more with every byte done, then once
// with kDone, the last call. It must return quickly and not call into
// tpushim. How long the calls go on is the StartupProgressUntil given to
// Create.
using StartupProgressCallback = std::function<void(const StartupProgress&)>;

// How long Create's StartupProgressCallback is called. They differ only
// with TPUSHIM_PREMAP=background, where Create returns while the region is
// still being premapped.
enum class StartupProgressUntil {
  // Only during Create (the default): the last call, kDone, comes before
  // Create returns, with the bytes premapped so far; then the callback is
  // destroyed and never called again. It may capture the caller's locals.
  kCreateReturns,
  // Until premapping ends: after Create returns the calls go on from the
  // premapping thread, up to kDone when the region is premapped, or when
  // premapping fails, or when the system is destroyed (~System makes that
  // call before it returns). Whatever the callback uses must live until
  // then.
  kPremapped,
};

// What AllocatePinnedHost does when the region is still being premapped
// (TPUSHIM_PREMAP=background) and the buffer fits only in a part of it
// that is not premapped yet.
enum class PremapWait {
  // Block until premapping reaches it (the default). Destroying the
  // system meanwhile ends the wait with CANCELLED.
  kWait,
  // Return UNAVAILABLE at once (retry later, or AwaitPremapped first).
  kNoWait,
};

class TPUSHIM_EXPORT System {
 public:
  // Brings the runtime up. `overrides` win over LIBTPU_INIT_ARGS and the
  // environment. Errors: INVALID_ARGUMENT for a malformed setting (naming
  // it and its value), RESOURCE_EXHAUSTED when the host cannot hold the
  // region, the failing OS call's status otherwise; nothing is left
  // mapped, pinned, open or running.
  static absl::StatusOr<std::unique_ptr<System>> Create(
      const OptionOverrides& overrides = {});
  // The same, telling `progress` (may be null) how start-up goes, during
  // Create only (StartupProgressUntil::kCreateReturns).
  static absl::StatusOr<std::unique_ptr<System>> Create(
      const OptionOverrides& overrides, StartupProgressCallback progress);
  // The same, telling `progress` until `until` (kPremapped: also how the
  // premapping behind the caller goes, after Create returned).
  static absl::StatusOr<std::unique_ptr<System>> Create(
      const OptionOverrides& overrides, StartupProgressCallback progress,
      StartupProgressUntil until);

  System(const System&) = delete;
  System& operator=(const System&) = delete;
  ~System();

  int device_count() const;
  // REQUIRES: 0 <= device < device_count() (a violation is a fatal error).
  const DeviceDescription& device(int device) const;
  // Start-up time (options to the last start-up line).
  absl::Duration init_time() const;
  // How far premapping the region has come: kPremapping with the bytes
  // premapped and served so far, or kDone once premapping has ended (at
  // once for a region premapped in the foreground or off), with the time
  // since Create was called (at the end, the time the region took). kDone
  // does not mean complete: premapping also ends when it fails or the
  // system is being destroyed, with done_bytes < total_bytes (the bytes
  // that serve); complete() tells the two apart, AwaitPremapped says why.
  StartupProgress premap_progress() const;
  // Blocks until the region is premapped (TPUSHIM_PREMAP=background) and
  // returns OK, or why premapping stopped short (the region then serves
  // only its first part, and the rest of the runtime works on). OK at
  // once when the region was premapped in the foreground or is off.
  absl::Status AwaitPremapped();
  // TPU_PREMAPPED_BUFFER_SIZE and the threshold in force (0 when off).
  uint64_t premapped_bytes() const;
  uint64_t transfer_threshold_bytes() const;
  // Where log files go ("" when there are none).
  std::string log_directory() const;

  // A buffer of `size` bytes from the premapped region, aligned to
  // `alignment` (a power of two <= 4096; at least 64). RESOURCE_EXHAUSTED
  // with libtpu's text when the region cannot serve it or it is above the
  // threshold; FAILED_PRECONDITION when the region is off.
  //
  // While the region is premapped behind the caller
  // (TPUSHIM_PREMAP=background) this can BLOCK: a buffer that fits only in
  // the part not premapped yet waits until premapping reaches it (or
  // stops: then RESOURCE_EXHAUSTED naming why, or CANCELLED when the
  // system is being destroyed, which stops premapping first and so ends
  // the wait at once). A buffer that could not fit even in the whole
  // region with the buffers now live fails at once. The overload below
  // with PremapWait::kNoWait never blocks.
  absl::StatusOr<PinnedHostBuffer> AllocatePinnedHost(uint64_t size,
                                                      size_t alignment = 64);
  // The same; with kNoWait, UNAVAILABLE at once where the one above would
  // wait for premapping.
  absl::StatusOr<PinnedHostBuffer> AllocatePinnedHost(uint64_t size,
                                                      size_t alignment,
                                                      PremapWait wait);

  // Device memory. When it does not fit: RESOURCE_EXHAUSTED with XLA's
  // text, then XLA's report of what holds the device's memory (its live
  // buffers, largest first, with their shapes, padding and labels).
  absl::StatusOr<DeviceBuffer> AllocateDevice(int device, uint64_t size);
  // A device buffer for one XLA array (docs/shapes.md): the device
  // reserves its size in its tiled layout, padding included. A malformed
  // shape or a tuple is INVALID_ARGUMENT naming what is wrong (the column
  // of a parse error); nothing is allocated on any error.
  absl::StatusOr<DeviceBuffer> AllocateDevice(int device,
                                              const DeviceBufferSpec& spec);
  // Frees `buffer` once `wait_for` and every operation already submitted
  // on it are done.
  absl::StatusOr<Event> Deallocate(const DeviceBuffer& buffer,
                                   absl::Span<const Event> wait_for = {});

  // Transfers (see TransferToDevice in docs/transfers.md).
  absl::StatusOr<Event> TransferToDevice(
      const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
      uint64_t size, absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  absl::StatusOr<Event> TransferFromDevice(
      const DeviceBuffer& src, uint64_t src_offset, void* dst, uint64_t size,
      absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  // The whole array of a shaped buffer, from or to the dense row-major
  // array a host holds (DeviceBuffer::host_size() bytes at src / dst):
  // laid out into the device's tiled layout on the way in (padding
  // zero-filled) and back on the way out, in the copy through staging. The
  // byte-range transfers above move the device layout's bytes as they are,
  // for a caller that holds them already tiled.
  absl::StatusOr<Event> TransferArrayToDevice(
      const void* src, const DeviceBuffer& dst,
      absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  absl::StatusOr<Event> TransferArrayFromDevice(
      const DeviceBuffer& src, void* dst, absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  // Copies `size` bytes between device buffers, on one device or two.
  // Source and destination may overlap (within one buffer): the
  // destination then holds what a memmove of the range gives, the
  // source's bytes as they were when the copy started.
  absl::StatusOr<Event> TransferDeviceToDevice(
      const DeviceBuffer& src, uint64_t src_offset, const DeviceBuffer& dst,
      uint64_t dst_offset, uint64_t size,
      absl::Span<const Event> wait_for = {});
  // The path a host transfer of `size` bytes at `host` would take.
  TransferPath PathFor(const void* host, uint64_t size) const;

  // A snapshot of the region, its allocator, every queue and device.
  SystemStats GetStats() const;

  struct Impl;  // driver/system.cc

 private:
  friend struct SystemFactory;  // driver/system_internal.h
  explicit System(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpushim

#endif  // TPUSHIM_SYSTEM_H_
