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
// Host memory registrations left are released (WARNING; see
// HostRegistration).
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
// it there frees nothing of the parent's and returns at once. A child that
// needs the runtime creates its own System.
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
#include "tpushim/memory.h"
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

// Host memory the caller owns and registered for DMA
// (System::RegisterHostMemory; PJRT's DmaMap): pinned once and mapped for
// every device, so that transfers wholly inside it are zero-copy whatever
// their size. Move-only; destroying it unregisters (an error is logged).
// The caller keeps the memory mapped until the registration ends.
//
// It may outlive its System: destroying the System releases the
// registrations left (unmapped and unpinned, with one WARNING naming how
// many and their bytes), and Unregister then does nothing and returns OK.
// In a fork() child, Unregister is FAILED_PRECONDITION (the registration
// is the parent's) and destroying it does nothing.
class TPUSHIM_EXPORT HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();

  const void* data() const { return data_; }
  uint64_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }
  // Ends the registration: new transfers no longer use it; BLOCKS until
  // the transfers submitted inside it (queued ones included) have
  // finished (their events are ready when it returns), then unmaps it
  // from the devices and unpins it. The
  // registration is empty afterwards, whatever the result. OK for an empty
  // one and once its System is gone.
  absl::Status Unregister();

  struct Owner;  // driver/system.cc

 private:
  friend class System;
  HostRegistration(std::shared_ptr<Owner> owner, uint64_t id, const void* data,
                   uint64_t size)
      : owner_(std::move(owner)), id_(id), data_(data), size_(size) {}

  std::shared_ptr<Owner> owner_;
  uint64_t id_ = 0;
  const void* data_ = nullptr;
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
  // Events (docs/transfers.md, "Events"). A host→device transfer with
  // both its events, ready and host_released (TransferEvents says when
  // each resolves on each path).
  absl::StatusOr<TransferEvents> TransferToDeviceWithEvents(
      const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
      uint64_t size, absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  absl::StatusOr<TransferEvents> TransferArrayToDeviceWithEvents(
      const void* src, const DeviceBuffer& dst,
      absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  // An event the caller sets later (CallerEvent); usable in this system's
  // wait_for lists. FAILED_PRECONDITION once the system is shutting down.
  absl::StatusOr<CallerEvent> CreateEvent();
  // `buffer`'s ready event: ready when every write issued to it so far
  // has completed; it fails with the first write to the buffer that ever
  // failed. INVALID_ARGUMENT for a deallocated or foreign buffer.
  absl::StatusOr<Event> BufferReadyEvent(const DeviceBuffer& buffer);
  // Fills `dst` chunk by chunk (PJRT's CreateBuffersForAsyncHostToDevice
  // and TransferData): after BeginChunkedTransfer, dst's ready event
  // resolves only once the chunk marked `is_last` and every chunk before
  // it have completed, failing with the first chunk that failed. Offsets
  // are in the buffer's device bytes (a shaped buffer's tiled image).
  // FAILED_PRECONDITION for a chunk after the last (or without Begin) and
  // for a second Begin while one is open; INVALID_ARGUMENT for a chunk
  // past the buffer's end. Deallocating dst before the last chunk fails
  // the chunked transfer with CANCELLED, naming the bytes no chunk covered
  // ("3072 of the buffer's 4096 bytes never came (1 chunk gave 1024
  // bytes)").
  absl::Status BeginChunkedTransfer(const DeviceBuffer& dst);
  absl::StatusOr<TransferEvents> TransferChunk(
      const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
      uint64_t size, bool is_last, absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  // Gives up the open chunked transfer into `dst` (PJRT's
  // SetBufferError): dst's ready event fails with `error`'s code and
  // message, followed by the bytes no chunk covered, instead of waiting
  // for a last chunk that will not come; so does every later ready event
  // of dst (its bytes are not what was meant). Chunks already queued still
  // run; later chunks are FAILED_PRECONDITION until another Begin.
  // INVALID_ARGUMENT for an OK `error` or a deallocated or foreign buffer;
  // FAILED_PRECONDITION when no chunked transfer is open on dst.
  absl::Status AbortChunkedTransfer(const DeviceBuffer& dst,
                                    absl::Status error);
  // The path a host transfer of `size` bytes at `host` would take
  // (kZeroCopy inside the region or a registration).
  TransferPath PathFor(const void* host, uint64_t size) const;

  // Registers the caller's host memory [data, data + size) for DMA by
  // every device, with or without the premapped region: pinned once
  // (long-term where the kernel can, else mlock), not inherited by fork()
  // children (its whole pages, until it is unregistered), and mapped into
  // each device's host window (an IOMMU mapping for vfio://). Byte and
  // array transfers whose host range lies wholly inside it are zero-copy,
  // whatever their size and the threshold (an array whose device layout
  // differs from the dense array still needs the copy through staging
  // that lays it out; a host address the device cannot DMA goes through
  // staging as anywhere else). Errors, with nothing changed:
  // INVALID_ARGUMENT for null or size 0, a range that overlaps another
  // registration (naming both ranges), the premapped region or the
  // engine's bounce pool, or that a device cannot DMA (for vfio://, not
  // 4096-byte aligned in start and size; the message names the alignment);
  // the pin's failure with the RLIMIT_MEMLOCK limit and how to raise it;
  // FAILED_PRECONDITION in a fork() child.
  absl::StatusOr<HostRegistration> RegisterHostMemory(const void* data,
                                                      uint64_t size);

  // A snapshot of the region, its allocator, every queue and device.
  SystemStats GetStats() const;

  // ---- Memory kinds (tpushim/memory.h; docs/api.md "Memory kinds") ------
  // Every memory, by id: the devices' HBM (0..N-1), pinned_host (N) and
  // unpinned_host (N+1), each with the devices that address it.
  std::vector<MemoryDescription> memories() const;
  // The id of the memory of `kind`: device `device`'s HBM for kDevice,
  // else the one host memory of that kind (`device` is not used).
  // REQUIRES: 0 <= device < device_count() for kDevice.
  int memory_of_kind(MemoryKind kind, int device = 0) const;
  // A device's default memory: its HBM. INVALID_ARGUMENT for a bad device.
  absl::StatusOr<int> DefaultMemory(int device) const;
  // A buffer of `size` bytes (>= 1), or of one XLA array, in `memory`:
  // in device memory, AllocateDevice's buffer; in a host memory zero-filled
  // bytes (a shaped buffer's tiled image, padding included). pinned_host
  // comes from the premapped region: RESOURCE_EXHAUSTED with libtpu's text
  // ("Attempting to allocate 8.00M. That was not possible. There are 6.43M
  // free. ...") then the report of what holds pinned_host, as for HBM;
  // FAILED_PRECONDITION when the region is off. INVALID_ARGUMENT for a bad
  // memory id, size or shape. Nothing is allocated on any error.
  absl::StatusOr<MemoryBuffer> AllocateInMemory(int memory, uint64_t size);
  absl::StatusOr<MemoryBuffer> AllocateInMemory(int memory,
                                                const DeviceBufferSpec& spec);
  // A buffer in `memory` holding the `size` bytes at `data` (PJRT's
  // BufferFromHostBuffer). Device memory: allocated and transferred as
  // TransferToDevice does with `semantics`. Host memories:
  //  * kImmutableZeroCopy / kMutableZeroCopy alias `data` (no copy) in
  //    unpinned_host always, in pinned_host when the range lies in memory
  //    every device DMAs directly (the premapped region, or a range
  //    registered with RegisterHostMemory). Outside it,
  //    kImmutableZeroCopy copies into a new pinned_host buffer (PJRT lets a
  //    runtime copy) and kMutableZeroCopy is INVALID_ARGUMENT (a copy could
  //    not be written through `data`).
  //  * the other semantics copy `data` into new bytes before returning.
  // The event is ready once the bytes are in place (at once for a host
  // memory); host_released says when `data` is free again (MemoryCopy).
  absl::StatusOr<MemoryCopy> CreateMemoryBuffer(
      const void* data, uint64_t size, int memory,
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableOnlyDuringCall);
  // The same for one XLA array: `data` is the dense row-major array
  // (DeviceBuffer::host_size() bytes for `spec`). Device memory: allocated
  // as AllocateDevice(memory, spec) and transferred as
  // TransferArrayToDeviceWithEvents. Host memories hold the tiled image:
  // the zero-copy semantics alias `data` only when the layout keeps the
  // dense bytes as they are (and, in pinned_host, they lie in memory every
  // device DMAs directly); otherwise the array is laid out into new bytes
  // (kMutableZeroCopy: INVALID_ARGUMENT). Shape errors as AllocateDevice.
  absl::StatusOr<MemoryCopy> CreateMemoryBuffer(
      const void* data, int memory, const DeviceBufferSpec& spec,
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableOnlyDuringCall);
  // A MemoryBuffer's ready event (PJRT's Buffer_ReadyEvent), in any
  // memory: device memory as BufferReadyEvent(buffer.device_buffer());
  // a host memory, the copy that filled it (ready at once for one
  // allocated or made from host bytes, which are in place when the call
  // returns). Writes the caller makes itself through data() are its own
  // to track. INVALID_ARGUMENT for a freed buffer or one of another
  // system.
  absl::StatusOr<Event> BufferReadyEvent(const MemoryBuffer& buffer);
  // A new buffer in `memory` with `src`'s bytes (and shape), copied once
  // `wait_for` is done: device ↔ pinned_host by one DMA from/to the region
  // (the zero-copy path, nothing staged), device ↔ unpinned_host through
  // the ordinary transfer paths, device → device by a device copy, host →
  // host by memcpy. The new buffer exists at once; its bytes are valid
  // when the event is ready with OK. Errors as AllocateInMemory, and
  // INVALID_ARGUMENT for a freed buffer or one of another system.
  absl::StatusOr<MemoryCopy> CopyToMemory(
      const MemoryBuffer& src, int memory,
      absl::Span<const Event> wait_for = {});
  // `buffer` as a MemoryBuffer of its device's memory (PJRT's
  // Buffer_Memory is then MemoryBuffer::memory()).
  MemoryBuffer AsMemoryBuffer(const DeviceBuffer& buffer) const;
  // Frees `buffer` once `wait_for` is done and its copies in flight are:
  // device memory as Deallocate; host bytes back to the region or heap
  // (aliased caller bytes are only forgotten). For a host memory the event
  // is ready once `wait_for` is (with the first failed event's status), by
  // when a copy listed in `wait_for` has let go of the bytes; a copy not
  // listed holds them until it is done. Using the buffer afterwards, or
  // freeing it twice, is INVALID_ARGUMENT. Buffers not freed go with the
  // system.
  absl::StatusOr<Event> Free(const MemoryBuffer& buffer,
                             absl::Span<const Event> wait_for = {});
  // One memory's statistics (PJRT's Device_MemoryStats fields).
  // INVALID_ARGUMENT for a bad memory id.
  absl::StatusOr<MemoryStats> GetMemoryStats(int memory) const;

  struct Impl;  // driver/system.cc

 private:
  friend struct SystemFactory;  // driver/system_internal.h
  explicit System(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpushim

#endif  // TPUSHIM_SYSTEM_H_
