// TransferEngine: moves bytes between host memory and devices, and between
// devices, through the devices' DMA queues, with
// tpu_driver's semantics — every operation returns an Event, may wait for
// other events, and starts in submission order within its queue.
//
// Queues: per device, one for host→device, one for device→host and one for
// device→device. An operation enters the queue of its direction (a
// device→device copy, the queue of its source device) and starts once it
// is at the head and every event in its `wait_for` list is ready. If any of
// them failed, the operation fails with that status without moving a byte.
// Operations behind it start after it has started (not finished): several
// are in flight at once.
//
// Paths (host↔device only), chosen per transfer and counted in Stats:
//  1. zero-copy — the host range lies in the premapped region, or wholly
//     inside host memory the caller registered (RegisterHostMemory):
//     descriptors name the region's or the registration's host window
//     directly, whatever the size.
//  2. staged — size <= TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES: the
//     bytes go through transient staging buffers allocated from the region,
//     in chunks (`Config::chunk_bytes` host→device,
//     `Config::from_device_chunk_bytes` device→host), at most
//     `Config::staging_depth` buffers per transfer, so copying chunk k+1
//     overlaps the DMA of chunk k. Staging bytes in flight are bounded by
//     `Config::max_staging_bytes` (waiting for room is backpressure, never a
//     failure).
//  3. pinned — larger than the threshold, the region is off, or no staging
//     room freed up within `Config::staging_wait`: the caller's pages are
//     pinned (Os::PinRange, fault point `pin`, reference-counted across
//     transfers) and registered with the device for this transfer only, in
//     pieces (`Config::pinned_piece_bytes`, at most
//     `Config::pinned_in_flight_bytes` at once) so that pinning the next
//     piece overlaps the DMA of this one; a piece is unregistered and
//     unpinned as soon as its DMA is done, and all of them before the
//     transfer's event is ready. A
//     WARNING naming the threshold says so, at most once per
//     `Config::fallback_warning_interval`, with the count of the ones it
//     did not print.
// A transfer fails only for a reason of its own (a DMA error, a failed
// pin, a failed dependency, shutdown), never because the region is busy.
//
// Device buffers: Allocate returns a DeviceBuffer (a shared handle).
// Deallocate frees it once the events it is given and every operation
// already submitted on the buffer have finished; using the handle after
// Deallocate is INVALID_ARGUMENT.
//
// Shutdown (and the destructor) cancels every operation that has not
// started (CANCELLED), lets every started one finish, releases all staging,
// pins and device memory, runs every pending callback and writes the trace
// (TPUSHIM_TRACE_FILE; see transfer/trace.h). Every event is ready when it
// returns. Calls after Shutdown are FAILED_PRECONDITION.
//
// Errors at submission (bad buffer, range, pointer, device, or after
// shutdown) come back at once from the call, and nothing is queued. Errors
// while running come back in the operation's event.
//
// Thread-safety: all methods are thread-safe, from any number of threads,
// callbacks included (Shutdown from a callback returns once everything
// else is done; the callback it runs in finishes afterwards). The engine
// must not be destroyed from one of its own callbacks.
// No engine lock is held while copying bytes, waiting, logging or running a
// callback; the one lock held across a call into a device is a queue's
// ring lock around Device::Submit (which never blocks), and the pin
// tracker's around mlock/munlock.
//
//   TPUSHIM_ASSIGN_OR_RETURN(auto engine, TransferEngine::Create(
//       devices, region, os, {}));
//   TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer b, engine->Allocate(0, n));
//   TPUSHIM_ASSIGN_OR_RETURN(Event up, engine->TransferToDevice(src, b, 0, n));
//   TPUSHIM_ASSIGN_OR_RETURN(Event down,
//       engine->TransferFromDevice(b, 0, dst, n, {up}));
//   TPUSHIM_RETURN_IF_ERROR(down.Await());

#ifndef TPUSHIM_TRANSFER_TRANSFER_ENGINE_H_
#define TPUSHIM_TRANSFER_TRANSFER_ENGINE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/premapped_region.h"
#include "device/device.h"
#include "env/options.h"
#include "env/os.h"
#include "tpushim/stats.h"
#include "tpushim/transfer.h"
#include "transfer/event.h"
#include "transfer/memory_profile.h"

namespace tpushim {

// Device memory held by live device buffers, per device.
struct DeviceMemoryUse {
  uint64_t buffers = 0;
  uint64_t padded_bytes = 0;
  uint64_t unpadded_bytes = 0;
  uint64_t peak_padded_bytes = 0;
  uint64_t peak_unpadded_bytes = 0;
  // Buffers allocated since start-up, and the largest of them (its size in
  // its layout), as PJRT's memory statistics count them.
  uint64_t num_allocs = 0;
  uint64_t largest_alloc_size = 0;
};

// Where a host range lies, for the paths and for aliasing host memory: in
// host memory every device can DMA directly (the premapped region, or a
// range the caller registered), or in ordinary pageable memory.
enum class HostRange {
  kPageable,
  kPremappedRegion,
  kRegistered,
};

class TransferEngine {
 public:
  struct Config {
    // Staging chunk size, host→device and device→host, and pipeline depth
    // (buffers per transfer). The sizes suit glibc's memcpy: copies into
    // staging stay below its non-temporal threshold, so the chunk is still
    // in cache when the DMA reads it; copies out of staging into the
    // caller's buffer are large enough to stream past the cache.
    uint64_t chunk_bytes = uint64_t{512} << 10;
    uint64_t from_device_chunk_bytes = uint64_t{1} << 20;
    int staging_depth = 8;
    // Zero-copy, pinned and device→device transfers are split into
    // descriptors of at most this size (several DMA engines share a large
    // transfer; the trace shows its progress).
    uint64_t descriptor_bytes = uint64_t{512} << 10;
    // The pinned path pins, registers, transfers and unpins the caller's
    // buffer in pieces of this size, with at most `pinned_in_flight_bytes`
    // of them pinned at once (at least one piece), so that pinning piece
    // k+1 overlaps the DMA of piece k.
    uint64_t pinned_piece_bytes = uint64_t{4} << 20;
    uint64_t pinned_in_flight_bytes = uint64_t{32} << 20;
    // Bound on staging bytes in flight; 0 = a quarter of the region, at
    // most 256 MiB, at least one chunk.
    uint64_t max_staging_bytes = 0;
    // How long a staged transfer waits for its first staging buffer before
    // it falls back to pinning.
    absl::Duration staging_wait = absl::Milliseconds(50);
    absl::Duration fallback_warning_interval = absl::Seconds(10);
    // Device→host chunks up to this size are copied out of staging on the
    // completing thread; larger ones on the engine's host copy thread, so
    // the copy overlaps the next chunk's DMA.
    uint64_t inline_copy_bytes = uint64_t{256} << 10;
    // With the premapped region off: a pinned pool of this many bytes the
    // engine maps, locks (as TPUSHIM_MLOCK says) and registers with every
    // device at start-up, and through which it stages host transfers of at
    // most `bounce_max_bytes` (and misaligned ones of any size) instead of
    // pinning the caller's pages per call. 0 = no pool. The limit is where
    // copying through the pool stops being cheaper than pinning: pinning
    // costs tens of microseconds a call whatever the size, a 1 MiB copy
    // about as much (docs/transfers.md has the measurements).
    uint64_t bounce_pool_bytes = kBouncePoolBytes;
    uint64_t bounce_max_bytes = kBounceMaxBytes;
    MlockMode bounce_mlock = MlockMode::kOn;
    // TPUSHIM_TRACE_FILE; empty = no trace.
    std::string trace_file{};
    // TPUSHIM_MEMORY_PROFILE, opened by whoever starts the engine
    // (MemoryProfile::ForDevices, before the region is premapped); null =
    // no profile. The engine records into it and closes it at shut-down.
    std::shared_ptr<MemoryProfile> memory_profile{};

    // The defaults, with what the options set (TPUSHIM_TRACE_FILE; the
    // memory profile is the caller's to open).
    static Config FromOptions(const Options& options);
  };

  using PathStats = tpushim::PathStats;
  using QueueStats = tpushim::QueueStats;
  using Stats = tpushim::TransferStats;

  // `devices` (non-empty, numbered 0..N-1 in order) must stay open, and
  // `region` (null = the region is off) and `os` must live, until the
  // engine is destroyed. Registers the region as a host window with every
  // device (undone on error), unless `region_windows` gives the windows it
  // is already registered as, one per device: the engine then owns them
  // and unregisters them at shutdown, or at once if Create fails.
  // INVALID_ARGUMENT for a bad config.
  static absl::StatusOr<std::unique_ptr<TransferEngine>> Create(
      std::vector<Device*> devices, PremappedRegion* region, Os* os,
      Config config, std::vector<HostWindowId> region_windows = {});

  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;
  ~TransferEngine();

  int device_count() const;

  // Allocates `size` (>= 1) bytes on `device`. RESOURCE_EXHAUSTED with
  // XLA's text when it does not fit, followed by XLA's HBM report of the
  // device's live buffers (device/hbm_report.h).
  absl::StatusOr<DeviceBuffer> Allocate(int device, uint64_t size);
  // Allocates the array `spec.shape` (one array, not a tuple) in its
  // layout: the padded size. INVALID_ARGUMENT (nothing allocated) for a
  // malformed shape or a tuple; RESOURCE_EXHAUSTED as above.
  absl::StatusOr<DeviceBuffer> Allocate(int device,
                                        const DeviceBufferSpec& spec);
  // Frees `buffer` after `wait_for` and every operation submitted on it so
  // far. The returned event is ready when the memory is free (with the
  // first failed dependency's status, the memory is freed all the same).
  absl::StatusOr<Event> Deallocate(const DeviceBuffer& buffer,
                                   absl::Span<const Event> wait_for = {});

  // Copies `size` bytes from host `src` to `dst` at `dst_offset`.
  absl::StatusOr<Event> TransferToDevice(
      const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
      uint64_t size, absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  // Copies `size` bytes from `src` at `src_offset` to host `dst`.
  absl::StatusOr<Event> TransferFromDevice(
      const DeviceBuffer& src, uint64_t src_offset, void* dst, uint64_t size,
      absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  // The whole array of a shaped buffer from the host's dense row-major
  // copy (`dst.host_size()` bytes at `src`), laid out into the tiled image
  // on the way, padding zero; and back. Staged through the premapped
  // region whatever the size (the copy into or out of each staging chunk
  // is the relayout); with the region off, or no staging room in time,
  // through a heap image of the device bytes on the pinned path. On a
  // byte buffer they move its whole size. The byte-range transfers above
  // move device-image bytes as they are.
  absl::StatusOr<Event> TransferArrayToDevice(
      const void* src, const DeviceBuffer& dst,
      absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  absl::StatusOr<Event> TransferArrayFromDevice(
      const DeviceBuffer& src, void* dst, absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  // Copies between device buffers, on the same device or two. Ranges of
  // one device's memory that overlap are copied as memmove copies them:
  // the copy's descriptors then run one at a time, in the order that
  // reads each source byte before it is overwritten (docs/transfers.md).
  absl::StatusOr<Event> TransferDeviceToDevice(
      const DeviceBuffer& src, uint64_t src_offset, const DeviceBuffer& dst,
      uint64_t dst_offset, uint64_t size,
      absl::Span<const Event> wait_for = {});

  // TransferToDevice and TransferArrayToDevice, returning both events
  // of the transfer: ready and host_released (tpushim/transfer.h,
  // TransferEvents).
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

  // An event the caller sets (tpushim/transfer.h, CallerEvent).
  // FAILED_PRECONDITION after Shutdown.
  absl::StatusOr<CallerEvent> CreateEvent();

  // `buffer`'s ready event: ready once every write issued to it so far
  // (host→device and device→device transfers into it, an open chunked
  // transfer) has completed; OK, or the first failure of a write to the
  // buffer — ever: a failed write leaves the buffer's bytes undefined, so
  // every later ready event of the buffer carries it. Ready at once when
  // nothing is being written. INVALID_ARGUMENT for an empty, foreign or
  // deallocated buffer.
  absl::StatusOr<Event> BufferReadyEvent(const DeviceBuffer& buffer);

  // Chunked host→device transfers into a pre-created buffer (PJRT's
  // async host-to-device transfer manager). BeginChunkedTransfer opens
  // one on `dst`: from then on dst's ready event waits for it. Each
  // TransferChunk queues one byte-range transfer (offsets and sizes in
  // the device buffer's bytes — for a shaped buffer its tiled image, as
  // the byte-range transfers move it); the one with `is_last` closes it.
  // The buffer's ready event resolves once the last chunk and every chunk
  // before it have completed, with the first chunk failure if any.
  // Errors, which change nothing: a chunk without an open transfer, or
  // after the last, is FAILED_PRECONDITION; a chunk overlapping the
  // buffer's end INVALID_ARGUMENT; a second Begin while one is open
  // FAILED_PRECONDITION. Deallocating the buffer, or Shutdown, before the
  // last chunk fails the transfer (and so the ready event) with
  // CANCELLED; AbortChunkedTransfer (PJRT's SetBufferError: a producer
  // that gives up) fails it with the caller's `error`. Either message
  // names the bytes no chunk covered ("3072 of the buffer's 4096 bytes
  // never came ..."); chunks already queued still run. Abort:
  // INVALID_ARGUMENT for an OK `error` or a bad buffer,
  // FAILED_PRECONDITION when no chunked transfer is open on it.
  absl::Status BeginChunkedTransfer(const DeviceBuffer& dst);
  absl::StatusOr<TransferEvents> TransferChunk(
      const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
      uint64_t size, bool is_last, absl::Span<const Event> wait_for = {},
      HostBufferSemantics semantics =
          HostBufferSemantics::kImmutableUntilTransferCompletes);
  absl::Status AbortChunkedTransfer(const DeviceBuffer& dst,
                                    absl::Status error);

  // The path a host transfer of `size` bytes at `host` would take now
  // (staged may still fall back to pinned when staging has no room).
  TransferPath PathFor(const void* host, uint64_t size) const;
  // Where [host, host + size) lies (see HostRange): the one test the
  // zero-copy path and aliasing pinned_host buffers share.
  HostRange ClassifyHostRange(const void* host, uint64_t size) const;

  // Registers the caller's host memory [data, data + size) for DMA and
  // returns its id: the range is pinned once (Os::PinRange, as the pinned
  // path pins, counted with its pins), its whole pages are excluded from
  // fork() (fault point `madvise`), and it becomes a host window of every
  // device. Until UnregisterHostMemory, host transfers wholly inside it
  // take the zero-copy path whatever their size (a host address the
  // device cannot DMA excepted, as in the region). The caller keeps the
  // memory mapped until then. Errors, with nothing changed:
  // INVALID_ARGUMENT for null or size 0, a range that wraps, one that is
  // not on a device's DeviceInfo::window_alignment (naming it), one that
  // overlaps the premapped region, the bounce pool or another
  // registration (naming both ranges); the pin's status with the memlock
  // limit and how to raise it; the failing madvise or device mapping's
  // status; FAILED_PRECONDITION after Shutdown or in a fork() child.
  absl::StatusOr<uint64_t> RegisterHostMemory(const void* data, uint64_t size);
  // Stops new transfers from using registration `id`, BLOCKS until every
  // transfer submitted inside it has finished (queued ones included),
  // then unmaps it from the devices, unpins it and lets fork() children
  // inherit it again. INVALID_ARGUMENT for an id that is not live (never
  // issued, unregistered, or being unregistered by another thread);
  // FAILED_PRECONDITION after Shutdown, which releases the registrations
  // left (one WARNING with their count and bytes), or in a fork() child.
  absl::Status UnregisterHostMemory(uint64_t id);

  Stats GetStats() const;
  // Per device, in device order.
  std::vector<DeviceMemoryUse> GetMemoryUse() const;
  void Shutdown();

 private:
  explicit TransferEngine(std::unique_ptr<transfer_internal::Engine> impl);
  std::unique_ptr<transfer_internal::Engine> impl_;
};

}  // namespace tpushim

#endif  // TPUSHIM_TRANSFER_TRANSFER_ENGINE_H_
