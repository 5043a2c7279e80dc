// The transfer engine's inside (transfer/transfer_engine.h is its face):
// the state of a device buffer (Allocation), of one operation and its
// chunks (Op, Chunk), and the Engine that runs them. Its methods are
// defined by job:
//
//   transfer_engine.cc     start-up, shutdown, statistics, the public wrappers
//   engine_buffers.cc      device buffers: allocate, use, deallocate, free
//   engine_queues.cc       path choice, submission, the queues, starting an
//                          operation, descriptors and ring overflow
//   engine_staging.cc      the staged path: staging budget and the pipeline
//   engine_pinned.cc       the pinned path
//   engine_registered.cc   registered host memory: register, look up, unregister
//   engine_completion.cc   DMA completions, finishing and cancelling
//   engine_events.cc       host_released, caller events, buffer readiness,
//                          chunked transfers
//
// Thread-safety: as TransferEngine's (see its header); the members say
// which lock guards them.

#ifndef TPUSHIM_TRANSFER_ENGINE_H_
#define TPUSHIM_TRANSFER_ENGINE_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "allocator/premapped_region.h"
#include "common/mutex.h"
#include "device/device.h"
#include "device/xla_shape.h"
#include "env/os.h"
#include "tpushim/transfer.h"
#include "transfer/bounce_pool.h"
#include "transfer/buffer_order.h"
#include "transfer/event.h"
#include "transfer/host_worker.h"
#include "transfer/memory_profile.h"
#include "transfer/pin_tracker.h"
#include "transfer/poll_gate.h"
#include "transfer/relayout.h"
#include "transfer/trace.h"
#include "transfer/transfer_engine.h"

namespace tpushim::transfer_internal {

// Transfers up to this size finish within microseconds: their awaiters
// poll before sleeping.
inline constexpr uint64_t kSpinAwaitMaxBytes = 256 << 10;

// How long a staged host→device copier polls for one of its buffers to
// come back before it sleeps.
inline constexpr int64_t kCopierSpinNs = 50'000;

// The array a shaped device buffer holds, and how to lay it out.
struct BufferShape {
  ArrayShape array;   // with the layout used
  std::string text;   // ToString(array)
  RelayoutPlan plan;  // host dense <-> device image
  uint64_t unpadded_bytes = 0;
  uint64_t host_bytes = 0;
};

// A device buffer's state, shared by its DeviceBuffer handles.
struct Allocation {
  uint64_t engine_serial = 0;
  int device = 0;
  uint64_t address = 0;
  // Device bytes: for a shaped buffer its padded image (image_bytes),
  // rounded up to the device's block (DeviceInfo::block_bytes).
  uint64_t size = 0;
  uint64_t image_bytes = 0;                  // == size for a byte buffer
  uint64_t unpadded = 0;                     // == size for a byte buffer
  uint64_t serial = 0;                       // allocation order, for reports
  std::shared_ptr<const BufferShape> shape;  // null for a byte buffer
  std::string label;
  std::string op_metadata;

  Mutex mu;
  // Operations submitted on the buffer and not finished.
  uint64_t ops ABSL_GUARDED_BY(mu) = 0;
  bool deallocating ABSL_GUARDED_BY(mu) = false;
  bool freed ABSL_GUARDED_BY(mu) = false;
  // Deallocate: what it still waits for (wait_for events not ready, plus
  // one for `ops` reaching 0), its event and first failed dependency.
  int dealloc_waiting ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<EventState> dealloc_event ABSL_GUARDED_BY(mu);
  absl::Status dealloc_error ABSL_GUARDED_BY(mu);
  // The order of the operations on the buffer (transfer/buffer_order.h):
  // every transfer takes its place here in the same critical section in
  // which it is queued (Engine::Submit), a chunked transfer at
  // BeginChunkedTransfer. Its unfinished writes, and the first that
  // failed, are the buffer's readiness.
  BufferOrder order ABSL_GUARDED_BY(mu);
  // A chunked transfer: none yet, open (its last chunk not given), or
  // closed by its last chunk (later chunks are refused).
  enum class Chunked : uint8_t { kNone, kOpen, kClosed };
  Chunked chunked ABSL_GUARDED_BY(mu) = Chunked::kNone;
  // Chunks submitted and not finished, the first failure among them, and
  // the event that resolves once the last chunk and all before it have
  // (a CallerEventHub event: shutdown fails it; an abort fails it at once).
  uint64_t chunks_running ABSL_GUARDED_BY(mu) = 0;
  absl::Status chunk_error ABSL_GUARDED_BY(mu);
  std::shared_ptr<EventState> chunked_done ABSL_GUARDED_BY(mu);
  // The chunked transfer's place in `order`: it is one write of the whole
  // buffer, issued at BeginChunkedTransfer. `chunked_end` resolves once
  // no chunk can run any more (closed, by its last chunk, an abort or a
  // deallocation, and every chunk given finished): what later operations
  // on the buffer wait for. Its chunks wait for `chunked_after` (what the
  // transfer waited for when it began) and for the earlier chunks they
  // overlap (`chunk_order`), never for the transfer itself.
  std::shared_ptr<EventState> chunked_end ABSL_GUARDED_BY(mu);
  std::vector<BufferOrder::Wait> chunked_after ABSL_GUARDED_BY(mu);
  BufferOrder chunk_order ABSL_GUARDED_BY(mu);
  // The byte ranges of the device buffer the open (or last) chunked
  // transfer's chunks were given for, merged and sorted, and how many
  // chunks: what an abandoned transfer's error names as still missing.
  std::vector<std::pair<uint64_t, uint64_t>> chunk_ranges ABSL_GUARDED_BY(mu);
  uint64_t chunks_given ABSL_GUARDED_BY(mu) = 0;
};

enum class OpKind { kToDevice, kFromDevice, kDeviceToDevice };

// Why a host transfer takes the pinned path (counted in Stats).
enum class PinReason : uint8_t {
  kOverThreshold,   // larger than the threshold
  kRegionOff,       // no region, and too large for the bounce pool
  kStagingTimeout,  // no staging room freed up within Config::staging_wait
  kNotPremapped,    // premapped behind the caller, staging room not yet
};
inline constexpr int kPinReasonCount = 4;

// The path PathFor chooses for a host transfer, and why.
struct PathChoice {
  TransferPath path = TransferPath::kPinned;
  PinReason pin_reason = PinReason::kOverThreshold;  // path == kPinned
  // The device cannot DMA the caller's buffer where it is
  // (DeviceInfo::host_alignment): staging is its only path, and it must
  // not fall back to pinning.
  bool misaligned = false;
  // Staged only because it is misaligned (counted, and warned about).
  bool rerouted = false;
  // Staged through the engine's bounce pool, not the region (the region
  // is off).
  bool bounce = false;
  // Zero-copy because the range lies in a live registration.
  bool registered = false;
};

// The order of a device-to-device copy's descriptors. A copy whose source
// and destination overlap in one device's memory (and differ) runs one
// descriptor at a time, each submitted when the one before completes, in
// the order that reads every source byte before any descriptor of the
// copy overwrites it: from the end when the destination lies above the
// source, from the start when below. Each descriptor is a memmove (the
// Device contract), so the whole copy is one.
enum class CopyOrder : uint8_t { kParallel, kChainedUp, kChainedDown };

struct Op;

// Host memory a caller registered (TransferEngine::RegisterHostMemory):
// pinned once, excluded from fork, and a host window of every device, so
// transfers inside it DMA straight from and to it.
struct Registration {
  enum class State : uint8_t {
    kRegistering,  // being pinned and mapped: overlaps are refused, no use
    kLive,         // transfers inside it take the zero-copy path
    kClosing,      // being unregistered: no new use; torn down at 0 users
  };
  // Constant after construction.
  uint64_t id = 0;
  uintptr_t begin = 0;
  uintptr_t end = 0;
  // Set before the state becomes kLive, read by the transfers that use it.
  std::vector<HostWindowId> windows;  // per device
  PinTracker::Lease lease;
  // The whole pages inside the range, excluded from fork (0 bytes when
  // the range holds no whole page).
  uintptr_t fork_begin = 0;
  uint64_t fork_bytes = 0;
  // Protected by Engine::reg_mu_.
  State state = State::kRegistering;
  uint64_t users = 0;  // operations submitted inside it and not finished
};

class Engine;

// An operation's use of a registration: Unregister waits until every use
// is dropped. Dropped when the operation completes (or is destroyed).
class RegistrationUse {
 public:
  RegistrationUse() = default;
  RegistrationUse(Engine* engine, std::shared_ptr<Registration> r)
      : engine_(engine), registration_(std::move(r)) {}
  RegistrationUse(const RegistrationUse&) = delete;
  RegistrationUse& operator=(const RegistrationUse&) = delete;
  RegistrationUse& operator=(RegistrationUse&& other) noexcept {
    Reset();
    engine_ = other.engine_;
    registration_ = std::move(other.registration_);
    return *this;
  }
  ~RegistrationUse() { Reset(); }
  const Registration* get() const { return registration_.get(); }
  explicit operator bool() const { return registration_ != nullptr; }
  void Reset();

 private:
  Engine* engine_ = nullptr;
  std::shared_ptr<Registration> registration_;
};

// Unmaps an array transfer's host image (Op::image).
struct HostImageUnmap {
  Os* os = nullptr;
  uint64_t bytes = 0;
  void operator()(char* p) const;
};

// The pinned path moves the caller's buffer in pieces: each is pinned and
// registered with the device while its descriptors run, then unregistered
// and unpinned, so pinning the next piece overlaps the DMA of this one.
struct PinnedPiece {
  uint64_t offset = 0;  // within the transfer
  uint64_t length = 0;
  uint32_t first_chunk = 0;  // its descriptors: chunks[first, first + count)
  uint32_t chunk_count = 0;
  PinTracker::Lease lease;
  HostWindowId window = kInvalidHostWindow;
  // Descriptors submitted and not yet completed.
  std::atomic<uint32_t> running{0};
};

struct Chunk {
  Op* op = nullptr;
  uint32_t index = 0;
  uint64_t offset = 0;  // within the transfer
  uint64_t length = 0;
  char* staging = nullptr;
  PinnedPiece* piece = nullptr;  // pinned path: the piece it belongs to
  int64_t submit_ns = 0;
};

struct Op {
  uint64_t id = 0;
  OpKind kind = OpKind::kToDevice;
  DmaDirection direction = DmaDirection::kHostToDevice;
  TransferPath path = TransferPath::kZeroCopy;
  PinReason pin_reason = PinReason::kOverThreshold;  // path == kPinned
  // The device cannot DMA the caller's buffer where it is (DeviceInfo::
  // host_alignment): staging is its only path.
  bool misaligned = false;
  // Staged through the bounce pool rather than the region's staging.
  bool bounce = false;
  // Zero-copy through a registration (held until the operation completes).
  RegistrationUse registration;
  bool registered = false;  // for the statistics, after the use is dropped
  int device = 0;             // the queue's device
  const char* src = nullptr;  // host source (to device)
  char* dst = nullptr;        // host destination (from device)
  uint64_t size = 0;
  std::shared_ptr<Allocation> buffer;  // device side (d2d: source)
  uint64_t buffer_offset = 0;
  std::shared_ptr<Allocation> peer;  // d2d destination
  uint64_t peer_offset = 0;
  CopyOrder copy_order = CopyOrder::kParallel;  // d2d
  // An array transfer: the host holds the dense array (src / dst) and the
  // device the tiled image of buffer->shape; `size` is the image's length.
  // Staged, each chunk's copy is the relayout; pinned, the whole image
  // goes through `image` (a mapping of its own the pinned path DMAs).
  const RelayoutPlan* relayout = nullptr;
  uint64_t image_bytes = 0;  // of `size`, the image; the rest is zero
  const char* dense_src = nullptr;
  char* dense_dst = nullptr;
  std::unique_ptr<char, HostImageUnmap> image;
  HostBufferSemantics semantics =
      HostBufferSemantics::kImmutableUntilTransferCompletes;
  std::shared_ptr<EventState> event;
  // Host→device, when the caller asked for it: host_released (see
  // TransferEvents), resolved by ReleaseHost.
  std::shared_ptr<EventState> released;
  int64_t submit_ns = 0;
  int64_t start_ns = 0;        // 0 until started
  uint64_t staging_chunk = 0;  // staged: bytes per staging buffer

  // A chunk of the buffer's chunked transfer (TransferChunk): it takes
  // its place in the buffer's order through the chunked transfer's.
  bool chunk = false;
  // Dependencies: unresolved wait_for events and earlier operations on the
  // buffers it touches (their order), plus one held by Submit.
  std::atomic<int> deps_pending{1};

  // Chunks not yet completed (and pinned pieces not yet released), plus
  // one held by the starter.
  std::atomic<uint64_t> outstanding{1};
  std::vector<Chunk> chunks;
  // Pinned path: the pieces, and the bytes of them pinned now.
  std::unique_ptr<PinnedPiece[]> pieces;
  uint32_t piece_count = 0;
  // Kept alive from start to finish (chunks point into it).
  std::shared_ptr<Op> self;
  // Set when the engine no longer reads or writes the caller's buffer
  // (kImmutableOnlyDuringCall waits for it).
  Notification host_released;

  Mutex mu;
  absl::Status error ABSL_GUARDED_BY(mu);
  // Staged host→device: buffers whose chunk completed, ready for reuse,
  // and whether the copier still wants them.
  std::vector<char*> free_staging ABSL_GUARDED_BY(mu);
  std::atomic<uint32_t> recycled{0};  // free_staging.size(), for polling
  bool copying ABSL_GUARDED_BY(mu) = true;
  bool copier_sleeping ABSL_GUARDED_BY(mu) = false;
  CondVar staging_cv;
  // Staged device→host: the next chunk to submit.
  uint32_t next_chunk ABSL_GUARDED_BY(mu) = 0;
  // Pinned path: bytes of pieces pinned and not yet released; the starter
  // waits on pin_cv for room under Config::pinned_in_flight_bytes.
  uint64_t pinned_in_flight ABSL_GUARDED_BY(mu) = 0;
  CondVar pin_cv;

  // Splits the transfer into chunks of `step` bytes (the last one may be
  // shorter; none for an empty transfer) and counts them outstanding.
  void LayOutChunks(uint64_t step) {
    const uint64_t n = size == 0 ? 0 : (size + step - 1) / step;
    chunks.resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      Chunk& c = chunks[i];
      c.op = this;
      c.index = static_cast<uint32_t>(i);
      c.offset = i * step;
      c.length = std::min(step, size - c.offset);
    }
    outstanding.fetch_add(n, std::memory_order_relaxed);
  }

  void RecordError(const absl::Status& s) {
    MutexLock lock(&mu);
    if (error.ok()) error = s;
  }
  absl::Status Error() {
    MutexLock lock(&mu);
    return error;
  }
};
class Engine {
 public:
  Engine(std::vector<Device*> devices, PremappedRegion* region, Os* os,
         TransferEngine::Config config, std::array<uint64_t, 2> chunk_bytes,
         uint64_t max_staging);
  ~Engine();

  // `region_windows`: the region's windows, already registered (or empty).
  absl::Status Start(std::vector<HostWindowId> region_windows);
  void Shutdown();

  int device_count() const { return static_cast<int>(devices_.size()); }
  absl::StatusOr<DeviceBuffer> Allocate(int device, uint64_t size);
  absl::StatusOr<DeviceBuffer> Allocate(int device,
                                        const DeviceBufferSpec& spec);
  absl::StatusOr<Event> Deallocate(const DeviceBuffer& buffer,
                                   absl::Span<const Event> wait_for);
  absl::StatusOr<Event> Submit(std::shared_ptr<Op> op,
                               absl::Span<const Event> wait_for);
  // Submits a host→device `op` made by NewHostOp or NewArrayOp with its
  // two events.
  absl::StatusOr<TransferEvents> SubmitWithRelease(
      std::shared_ptr<Op> op, absl::Span<const Event> wait_for);
  // Caller events and buffer readiness (engine_events.cc).
  absl::StatusOr<CallerEvent> CreateEvent();
  absl::StatusOr<Event> BufferReadyEvent(const DeviceBuffer& buffer);
  absl::Status BeginChunkedTransfer(const DeviceBuffer& dst);
  absl::StatusOr<TransferEvents> TransferChunk(const void* src,
                                               const DeviceBuffer& dst,
                                               uint64_t dst_offset,
                                               uint64_t size, bool is_last,
                                               absl::Span<const Event> wait_for,
                                               HostBufferSemantics semantics);
  absl::Status AbortChunkedTransfer(const DeviceBuffer& dst,
                                    absl::Status error);
  // INVALID_ARGUMENT when `wait_for` holds a pending event of another
  // engine: its continuation would call into this one, which may be gone
  // by then.
  absl::Status CheckWaitFor(absl::Span<const Event> wait_for) const {
    for (const Event& e : wait_for) {
      const auto& state = e.state();
      if (state->owner() != nullptr && state->owner() != this &&
          !state->IsReady()) {
        return absl::InvalidArgumentError(
            "wait_for holds a pending event of another system; wait for "
            "it (Await or a callback) before submitting here");
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<Op>> NewHostOp(OpKind kind,
                                                const DeviceBuffer& buffer,
                                                uint64_t offset,
                                                const void* host, uint64_t size,
                                                HostBufferSemantics semantics);
  // A transfer of the whole array of `buffer` from or to the host's dense
  // copy at `host` (DeviceBuffer::host_size() bytes).
  absl::StatusOr<std::shared_ptr<Op>> NewArrayOp(OpKind kind,
                                                 const DeviceBuffer& buffer,
                                                 const void* host,
                                                 HostBufferSemantics semantics);
  absl::StatusOr<std::shared_ptr<Op>> NewDeviceToDeviceOp(
      const DeviceBuffer& src, uint64_t src_offset, const DeviceBuffer& dst,
      uint64_t dst_offset, uint64_t size);
  // The path a host transfer of `size` bytes at `host` to or from
  // `device` takes, and why; `registrations` false ignores registered
  // host memory.
  PathChoice PathFor(const void* host, uint64_t size, int device,
                     bool registrations = true) const;
  // Where [host, host + size) lies: the single place that decides whether
  // a host range is the premapped region, which the devices DMA directly
  // (the zero-copy path, and aliasing by pinned_host buffers). Lock-free.
  // Registered host memory is not classified here (PathFor looks it up).
  HostRange ClassifyHostRange(const void* host, uint64_t size) const;

  // Registered host memory (transfer/engine_registered.cc); see
  // TransferEngine.
  absl::StatusOr<uint64_t> RegisterHostMemory(const void* data, uint64_t size);
  absl::Status UnregisterHostMemory(uint64_t id);
  // Drops one use of `r` (RegistrationUse::Reset).
  void DropRegistrationUse(Registration& r);
  // Whether the region's staging room is premapped (always, unless it is
  // premapped behind the caller and not that far yet). REQUIRES: a region.
  bool StagingReady() const {
    return region_->allocator().ready_bytes() >=
           std::min(max_staging_, region_->size());
  }
  TransferEngine::Stats GetStats() const;
  std::vector<DeviceMemoryUse> GetMemoryUse() const;

  static std::shared_ptr<Allocation> AllocationOf(const DeviceBuffer& b) {
    return b.allocation_;
  }

 private:
  struct Queue {
    int device = 0;
    DmaDirection direction = DmaDirection::kHostToDevice;
    Device* dev = nullptr;

    Mutex mu;
    CondVar cv;
    // Operations not started, by submission order (Op::id): those still
    // waiting for dependencies, and those whose dependencies are resolved,
    // which start lowest id first. A waiting one never holds up the ready.
    absl::btree_map<uint64_t, std::shared_ptr<Op>> waiting ABSL_GUARDED_BY(mu);
    absl::btree_map<uint64_t, std::shared_ptr<Op>> ready ABSL_GUARDED_BY(mu);
    // An operation is being started (by the worker, or inline): one at a
    // time, so that starts follow the order above.
    bool starting ABSL_GUARDED_BY(mu) = false;
    bool stop ABSL_GUARDED_BY(mu) = false;
    std::thread worker;

    // Descriptors the ring had no room for, in order. Device::Submit is
    // called under ring_mu (it never blocks) so the ring sees one order.
    Mutex ring_mu;
    std::deque<DmaDescriptor> overflow ABSL_GUARDED_BY(ring_mu);
    std::atomic<bool> has_overflow{false};

    std::atomic<uint64_t> submitted{0}, completed{0}, failed{0}, cancelled{0},
        descriptors{0}, ring_full{0}, in_flight{0};
  };

  // The sink of one device.
  class Sink final : public DmaCompletionSink {
   public:
    Sink(Engine* engine, int device) : engine_(engine), device_(device) {}
    void OnDmaComplete(DmaDirection direction,
                       absl::Span<const DmaCompletion> completions) override {
      engine_->OnDmaComplete(device_, direction, completions);
    }

   private:
    Engine* const engine_;
    const int device_;
  };

  Queue& QueueOf(int device, DmaDirection d) {
    return *queues_[device * kDmaDirectionCount + static_cast<int>(d)];
  }
  absl::Status CheckOpen() const;
  absl::Status CheckDevice(int device) const;
  absl::StatusOr<std::shared_ptr<Allocation>> UseBuffer(
      const DeviceBuffer& buffer, uint64_t offset, uint64_t size,
      absl::string_view what);
  void ReleaseBufferUse(const std::shared_ptr<Allocation>& a);
  // Takes `op`'s place in the order of the buffers it touches, and appends
  // to `after` what it must wait for there. REQUIRES: the buffers' locks.
  static void PlaceInOrder(Op& op, std::vector<BufferOrder::Wait>* after)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Records `op` in the order of its buffers (after PlaceInOrder's
  // conflicts, under the same locks).
  static void RecordInOrder(Op& op) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Resolves `a`'s chunked_end once its chunked transfer is closed and no
  // chunk runs. REQUIRES: a.mu; returns the event to resolve (outside it).
  static std::shared_ptr<EventState> TakeChunkedEnd(Allocation& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu);
  // A chunk of `a`'s chunked transfer finished with `s`.
  void ChunkFinished(const std::shared_ptr<Allocation>& a,
                     const absl::Status& s);
  // Fails `a`'s open chunked transfer with `status`'s code and message,
  // followed by the bytes its chunks never covered. False when none is
  // open.
  bool AbandonChunked(Allocation& a, const absl::Status& status);
  // The staged path is done with the caller's buffer (`status`: OK when
  // every byte was copied): resolves host_released, wakes a
  // kImmutableOnlyDuringCall caller.
  static void ReleaseHost(Op& op, const absl::Status& status);
  void DeallocStep(const std::shared_ptr<Allocation>& a);
  void FreeAllocation(const std::shared_ptr<Allocation>& a);
  // `a` as the memory profile records it.
  static MemoryProfile::Buffer ProfileBuffer(const Allocation& a);
  // Allocates `size` device bytes for `a` (device, shape and label set)
  // and makes it live; on RESOURCE_EXHAUSTED adds XLA's HBM report.
  absl::StatusOr<DeviceBuffer> AllocateLive(std::shared_ptr<Allocation> a);
  std::string HbmReport(const Allocation& request) const;
  // Pinned path of an array transfer: the heap image it DMAs, packed from
  // the host array (to device). False (status recorded) when there is no
  // memory for it.
  bool PrepareImage(Op& op);

  // One of `op`'s dependencies is done; the last one makes it ready.
  // `may_start` lets this thread start it itself when its queue is idle
  // and starting cannot block: kAny (the submitting thread) whatever its
  // size, kSmall (a thread that resolved a dependency) only a small one
  // that pins nothing.
  enum class MayStart : uint8_t { kNo, kSmall, kAny };
  void DepDone(const std::shared_ptr<Op>& op, MayStart may_start);
  // The index of a queue (device, direction): BufferOrder's tag.
  static int QueueTag(int device, DmaDirection d);
  // The operation of `q` to start next (null when none may start now).
  static std::shared_ptr<Op> NextReady(Queue& q)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu);
  // Starts `op` (taken from its queue, q.starting set) on this thread;
  // puts it back for the worker when starting would block.
  void StartHere(Queue& q, const std::shared_ptr<Op>& op);
  void WorkerLoop(Queue& q);
  // Starts `op`. With `may_block` false, returns false (having done
  // nothing) when starting would have to wait for staging room.
  bool StartOp(const std::shared_ptr<Op>& op, bool may_block);
  std::string PathReason(const Op& op) const;
  bool InlineStartable(const Op& op) const;
  void StartDescriptors(Op& op, HostWindowId window, uint64_t host_base);
  // The first staging buffer of a staged transfer, waiting up to
  // Config::staging_wait when `may_block`. kWouldBlock: none now and
  // `may_block` is false (nothing done). kHandled: none in time, so the
  // operation went pinned, or was cancelled by shutdown.
  enum class FirstStaging { kAcquired, kWouldBlock, kHandled };
  FirstStaging AcquireFirstStaging(Op& op, bool may_block, char** first);
  // The staged paths, once the first staging buffer is in hand (null for
  // an empty transfer).
  void StartStagedToDevice(Op& op, char* first);
  void StartStagedFromDevice(Op& op, char* first);
  void StartPinned(Op& op, PinReason reason);
  // Lays the pinned path's pieces and their descriptors out; returns the
  // number of pieces.
  uint32_t LayOutPinned(Op& op);
  // Unregisters and unpins a piece whose descriptors have all completed;
  // on the device's host worker.
  void ReleasePiece(Op& op, PinnedPiece& piece);
  void SubmitChunk(Op& op, Chunk& chunk, HostWindowId window,
                   uint64_t host_offset);
  void SubmitDescriptors(Queue& q, absl::Span<const DmaDescriptor> d);
  void DrainOverflow(Queue& q);
  void SubmitOverflowLocked(Queue& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.ring_mu);
  // Counts `n` chunks (or pieces) of `op` done; the last one completes it.
  void ChunkDone(Op& op, uint64_t n = 1);
  void CompleteOp(Op& op);
  void CancelUnstarted(const std::shared_ptr<Op>& op, absl::Status status);
  void OnDmaComplete(int device, DmaDirection direction,
                     absl::Span<const DmaCompletion> completions);
  void NextFromDevice(Op& op, Chunk& chunk, bool ok);
  // A chained device-to-device copy (CopyOrder): submits the descriptor
  // after `chunk`, or, when `chunk` failed or was the last, counts the
  // rest done.
  void NextChainedCopy(Op& op, const Chunk& chunk, bool ok);
  // Staged device→host: the chunk's bytes into the caller's buffer (laid
  // out back into the dense array for an array transfer).
  void CopyOut(Op& op, const Chunk& chunk);
  // An array transfer's bytes [offset, offset + n) of the device image
  // from the dense host array (zero past the image), and back.
  static void PackRange(const Op& op, uint64_t offset, uint64_t n, char* dst);
  static void UnpackRange(const Op& op, const char* src, uint64_t offset,
                          uint64_t n);
  void WarnPinned(const Op& op, PinReason reason);
  void WarnMisaligned(const Op& op, const void* host);
  // The rate limit the fallback WARNINGs share: at most one every
  // Config::fallback_warning_interval. False when this one is suppressed;
  // else *suppressed is how many were since the last one printed.
  bool TakeWarningTurn(uint64_t* suppressed);

  // A staging buffer of `bytes` for `op`, from the region within the
  // staging budget, or from the bounce pool (Op::bounce); waits until
  // `deadline_ns` for room. Null when there is none by then.
  char* AcquireStaging(const Op& op, uint64_t bytes, int64_t deadline_ns,
                       bool* waited);
  void ReleaseStaging(const Op& op, char* p, uint64_t bytes);
  // The region's staging, within the budget; null when there is no room.
  char* TakeRegionStaging(uint64_t bytes);
  // Where `op`'s staging buffers live, for its descriptors.
  HostWindowId StagingWindow(const Op& op) const {
    return op.bounce ? bounce_windows_[op.device] : region_windows_[op.device];
  }
  uint64_t StagingOffset(const Op& op, const char* p) const {
    const char* base =
        op.bounce ? bounce_->base() : static_cast<const char*>(region_->base());
    return static_cast<uint64_t>(p - base);
  }
  // Staging buffers one transfer holds at once: Config::staging_depth, and
  // two in the bounce pool, which all devices share.
  int StagingDepth(const Op& op) const {
    return op.bounce ? std::min(config_.staging_depth, 2)
                     : config_.staging_depth;
  }
  // Maps the bounce pool and registers it with every device.
  absl::Status StartBouncePool();
  // The live registration holding [host, host + size), or null.
  std::shared_ptr<Registration> FindRegistrationLocked(const void* host,
                                                       uint64_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reg_mu_);
  // A use of the live registration holding [host, host + size) (empty when
  // there is none).
  RegistrationUse TakeRegistrationUse(const void* host, uint64_t size);
  // Unmaps `r` from the devices, unpins it, lets fork() see it again.
  // Errors are logged (the memory is released all the same).
  void TearDownRegistration(Registration& r);
  // Shutdown: releases the registrations left, with one WARNING.
  void ReleaseRegistrations();
  // RegisterHostMemory's memlock error: the limit and how to raise it.
  absl::Status PinError(const absl::Status& s, const void* data, uint64_t size);

  // Constant after construction.
  const uint64_t serial_;
  const std::vector<Device*> devices_;
  PremappedRegion* const region_;
  Os* const os_;
  const TransferEngine::Config config_;
  // Staging chunk per direction (host→device, device→host).
  const std::array<uint64_t, 2> chunk_bytes_;
  const uint64_t max_staging_;
  const uint64_t threshold_;
  const int64_t origin_ns_;
  // The process that made the engine: in a fork() child every call is
  // FAILED_PRECONDITION before it takes a lock (env/fork_guard.h).
  const pid_t owner_pid_;

  CallbackExecutor callbacks_;
  // Lets waiters of small transfers run their descriptors (Submit); closed
  // first thing in Shutdown.
  const std::shared_ptr<PollGate> poll_gate_;
  // The events callers set; failed (CANCELLED) at shutdown.
  std::shared_ptr<CallerEventHub> caller_events_;
  // Host-side completion work, one worker per device so that one device's
  // slow work (unpinning a large buffer) never delays another's.
  std::vector<std::unique_ptr<HostWorker>> host_workers_;
  PinTracker pins_;
  std::unique_ptr<TraceRecorder> trace_;
  // TPUSHIM_MEMORY_PROFILE (Config::memory_profile), set by Start() and
  // closed by Shutdown().
  std::shared_ptr<MemoryProfile> memory_profile_;
  std::vector<std::unique_ptr<Sink>> sinks_;
  std::vector<HostWindowId> region_windows_;  // per device
  // The region is off: the bounce pool (null when Config::bounce_pool_bytes
  // is 0) and its windows, per device. Set by Start().
  std::unique_ptr<BouncePool> bounce_;
  std::vector<HostWindowId> bounce_windows_;
  std::vector<std::unique_ptr<Queue>> queues_;
  std::atomic<uint64_t> next_op_id_{1};

  mutable Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  CondVar shut_down_cv_;
  absl::flat_hash_map<Allocation*, std::shared_ptr<Allocation>> live_
      ABSL_GUARDED_BY(mu_);
  uint64_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_allocation_serial_ ABSL_GUARDED_BY(mu_) = 1;
  // Per device: padded and unpadded bytes of live buffers, and their peaks.
  std::vector<DeviceMemoryUse> memory_use_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> closing_{false};  // mirrors shutting_down_, lock-free

  // Operations not yet ready; Shutdown waits for 0.
  Mutex idle_mu_;
  CondVar idle_cv_;
  uint64_t unfinished_ ABSL_GUARDED_BY(idle_mu_) = 0;
  // Stats::events_pending: like unfinished_, but decremented just before
  // the event is resolved (unfinished_ only after, for Shutdown), so a
  // caller that saw every event ready reads 0.
  std::atomic<uint64_t> events_not_ready_{0};
  // DMA threads inside OnDmaComplete. The one that completes the last
  // operation still touches the engine afterwards (DrainOverflow, a
  // HostWorker wake-up), so Shutdown waits for 0 after unfinished_ is 0.
  std::atomic<int> in_completion_{0};

  // Staging budget.
  std::atomic<uint64_t> staging_in_flight_{0};
  std::atomic<uint64_t> staging_peak_{0};
  Mutex staging_mu_;
  CondVar staging_cv_;
  int staging_waiters_ ABSL_GUARDED_BY(staging_mu_) = 0;
  std::atomic<uint64_t> staging_waits_{0};
  std::atomic<int64_t> staging_wait_ns_{0};

  // Statistics.
  struct PathCounters {
    std::atomic<uint64_t> transfers{0}, bytes{0}, failed{0};
    std::atomic<int64_t> busy_ns{0};
    std::atomic<int64_t> active_ns{0};
  };
  std::array<std::array<PathCounters, kTransferPathCount>, 2> host_stats_;
  PathCounters d2d_stats_;
  // Why transfers were pinned, by PinReason.
  std::array<std::atomic<uint64_t>, kPinReasonCount> pinned_reasons_{};
  std::atomic<uint64_t> staged_misaligned_{0};
  std::atomic<uint64_t> staged_bounce_{0};
  // Zero-copy transfers through registrations, per direction.
  std::array<std::atomic<uint64_t>, 2> registered_transfers_{};
  std::array<std::atomic<uint64_t>, 2> registered_bytes_{};

  // Registered host memory. Lock order: reg_mu_ before nothing else of
  // the engine; never held across a device call, a pin or a wait.
  mutable Mutex reg_mu_;
  CondVar reg_cv_;  // a registration's users reached 0, or one went away
  // By begin address; every state (overlaps are checked against all).
  std::map<uintptr_t, std::shared_ptr<Registration>> registrations_
      ABSL_GUARDED_BY(reg_mu_);
  uint64_t next_registration_id_ ABSL_GUARDED_BY(reg_mu_) = 1;
  uint64_t registered_bytes_now_ ABSL_GUARDED_BY(reg_mu_) = 0;
  bool registrations_closed_ ABSL_GUARDED_BY(reg_mu_) = false;  // Shutdown
  // Live registrations: PathFor skips the lock while there are none.
  std::atomic<uint64_t> live_registrations_{0};

  // Rate limit of the pinned-path WARNING.
  Mutex warn_mu_;
  int64_t last_warning_ns_ ABSL_GUARDED_BY(warn_mu_) = 0;
  uint64_t suppressed_warnings_ ABSL_GUARDED_BY(warn_mu_) = 0;
};

}  // namespace tpushim::transfer_internal

#endif  // TPUSHIM_TRANSFER_ENGINE_H_
