// MemorySpaces: the memory kinds of one System (tpushim/memory.h) — the
// list of memories, buffers in the host memories, copies between kinds and
// the host memories' statistics. System's memory-kind methods forward here.
//
// Copies (CopyToMemory):
//   device → device            one device-to-device copy
//   device ↔ pinned_host       one transfer from/to the buffer's region
//                              bytes: the zero-copy path, nothing staged
//   device ↔ unpinned_host     one transfer through the ordinary paths
//                              (staged, or pinned above the threshold)
//   host → host                one memcpy, on this object's own thread
// Every copy keeps the source's and destination's host bytes alive until
// its event is ready, whatever Free does meanwhile.
//
// Thread-safety: all methods are thread-safe. No lock is held while
// copying bytes, allocating from the region or calling the engine.

#ifndef TPUSHIM_DRIVER_MEMORY_SPACES_H_
#define TPUSHIM_DRIVER_MEMORY_SPACES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "allocator/premapped_region.h"
#include "common/mutex.h"
#include "tpushim/memory.h"
#include "tpushim/system.h"
#include "transfer/buffer_order.h"
#include "transfer/event.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace memory_internal {

// What the host memories have held: [0] pinned_host, [1] unpinned_host.
struct HostCounters {
  struct One {
    uint64_t bytes_in_use = 0;
    uint64_t peak_bytes_in_use = 0;
    uint64_t num_allocs = 0;
    uint64_t largest_alloc_size = 0;
    uint64_t buffers_live = 0;
  };
  Mutex mu;
  One host[2] ABSL_GUARDED_BY(mu);
};

// Host bytes a buffer owns: a region allocation (pinned_host) or a
// page-aligned heap block (unpinned_host). Freed when the last holder (the
// buffer, copies in flight) lets go.
struct HostStorage {
  HostStorage() = default;
  HostStorage(const HostStorage&) = delete;
  HostStorage& operator=(const HostStorage&) = delete;
  ~HostStorage();

  PinnedHostBuffer pinned;
  void* heap = nullptr;
  char* data = nullptr;
  uint64_t size = 0;
  std::shared_ptr<HostCounters> counters;
  int slot = 0;  // in HostCounters::host
};

struct BufferState {
  const void* owner = nullptr;  // the MemorySpaces that made it
  int memory = 0;
  MemoryKind kind = MemoryKind::kDevice;
  uint64_t size = 0;
  DeviceBuffer device;   // kind == kDevice
  char* data = nullptr;  // host kinds
  bool aliased = false;
  bool mutable_alias = false;
  // Shaped buffers: the shape with its layout (empty for bytes).
  std::string shape;
  uint64_t unpadded = 0;
  uint64_t host_bytes = 0;
  std::string label;
  std::string op_metadata;

  Mutex mu;
  std::shared_ptr<HostStorage> storage ABSL_GUARDED_BY(mu);  // null: aliased
  bool freed ABSL_GUARDED_BY(mu) = false;
  // Host kinds: the order of the operations on the buffer's bytes (the
  // copy that filled it, the copies that read it; see
  // transfer/buffer_order.h), each placed in the same critical section in
  // which it is submitted. Its unfinished writes, and the first that
  // failed, are the buffer's readiness. No continuation takes order_mu.
  Mutex order_mu;
  transfer_internal::BufferOrder order ABSL_GUARDED_BY(order_mu);
};

}  // namespace memory_internal

class MemorySpaces {
 public:
  // How the system allocates from the region (System::AllocatePinnedHost,
  // which counts the allocation).
  using AllocatePinned =
      std::function<absl::StatusOr<PinnedHostBuffer>(uint64_t size)>;

  // `engine`, `region` (null when off) and `system` must outlive this.
  MemorySpaces(System* system, TransferEngine* engine, PremappedRegion* region,
               std::vector<DeviceDescription> devices,
               AllocatePinned allocate_pinned);
  MemorySpaces(const MemorySpaces&) = delete;
  MemorySpaces& operator=(const MemorySpaces&) = delete;
  ~MemorySpaces();

  // After the engine has shut down, before the region goes: runs the
  // copies still queued here and releases every host buffer's bytes.
  void Shutdown();

  int pinned_host_id() const { return device_count_; }
  int unpinned_host_id() const { return device_count_ + 1; }
  std::vector<MemoryDescription> List() const;
  // INVALID_ARGUMENT naming `memory` and the ids there are.
  absl::Status CheckMemory(absl::string_view what, int memory) const;

  absl::StatusOr<MemoryBuffer> Allocate(int memory, uint64_t size);
  absl::StatusOr<MemoryBuffer> Allocate(int memory,
                                        const DeviceBufferSpec& spec);
  absl::StatusOr<MemoryCopy> Create(const void* data, uint64_t size, int memory,
                                    HostBufferSemantics semantics);
  // The same for one array: `data` is the dense row-major array
  // (host_size bytes), laid out into the tiled image.
  absl::StatusOr<MemoryCopy> Create(const void* data, int memory,
                                    const DeviceBufferSpec& spec,
                                    HostBufferSemantics semantics);
  // A host buffer's ready event (the writes issued to it: the copy that
  // filled it); device memory: the engine's BufferReadyEvent.
  absl::StatusOr<Event> ReadyEvent(const MemoryBuffer& buffer);
  absl::StatusOr<MemoryCopy> CopyToMemory(const MemoryBuffer& src, int memory,
                                          absl::Span<const Event> wait_for);
  absl::StatusOr<Event> Free(const MemoryBuffer& buffer,
                             absl::Span<const Event> wait_for);
  MemoryBuffer Wrap(const DeviceBuffer& buffer) const;

  // pinned_host allocations made outside memory kinds
  // (System::AllocatePinnedHost) count too.
  void CountPinnedAllocation(uint64_t size);
  // A host memory's statistics (the region's for pinned_host).
  MemoryStats HostStats(int memory) const;

 private:
  using State = memory_internal::BufferState;
  // The state of `buffer`, checked: ours, not freed.
  absl::StatusOr<std::shared_ptr<State>> Use(absl::string_view what,
                                             const MemoryBuffer& buffer) const;
  // New host bytes in `memory` (a host memory), zero-filled. pinned_host:
  // RESOURCE_EXHAUSTED with the region's text and the pinned_host report.
  absl::StatusOr<std::shared_ptr<memory_internal::HostStorage>> NewStorage(
      absl::string_view what, int memory, uint64_t size, const State* request);
  // A host buffer's state over `storage`, listed for the pinned_host
  // report at once (NewHostState), or once the caller has filled in the
  // rest (MakeHostState, then Publish): the report reads the fields of
  // listed states without their lock, so a state is listed only whole.
  std::shared_ptr<State> NewHostState(
      int memory, std::shared_ptr<memory_internal::HostStorage> storage);
  std::shared_ptr<State> MakeHostState(
      int memory, std::shared_ptr<memory_internal::HostStorage> storage);
  void Publish(const std::shared_ptr<State>& s) ABSL_LOCKS_EXCLUDED(mu_);
  std::string PinnedReport(const State& request) const;
  // A host buffer over the caller's `size` bytes at `data` (no copy), and
  // its host_released event: set once the last holder lets the bytes go.
  absl::StatusOr<MemoryCopy> Alias(int memory, const void* data, uint64_t size,
                                   bool is_mutable);
  // Whether [data, data + size) may be aliased as a buffer of `memory`.
  bool CanAlias(int memory, const void* data, uint64_t size) const;
  // Runs `fn` once every event of `wait_for` is ready with OK (on this
  // object's thread, or inline when they already are); the event is
  // ready with fn's status, or with the first failed event's.
  absl::StatusOr<Event> AfterAll(absl::Span<const Event> wait_for,
                                 std::function<absl::Status()> fn);

  // Constant after construction.
  System* const system_;
  TransferEngine* const engine_;
  PremappedRegion* const region_;
  const std::vector<DeviceDescription> devices_;
  const int device_count_;
  const AllocatePinned allocate_pinned_;
  const std::shared_ptr<memory_internal::HostCounters> counters_;

  std::unique_ptr<transfer_internal::CallbackExecutor> executor_;
  mutable Mutex mu_;
  // Host buffers made here, for Shutdown and the pinned_host report.
  std::vector<std::weak_ptr<State>> host_buffers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpushim

#endif  // TPUSHIM_DRIVER_MEMORY_SPACES_H_
