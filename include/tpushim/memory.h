// Memory kinds, as PJRT names them: the memories a System lists, buffers
// that live in any of them, and their statistics (see docs/api.md,
// "Memory kinds").
//
//   device         one per device: its HBM, the device's default memory
//   pinned_host    the premapped region, which every device DMAs directly
//   unpinned_host  pageable host memory, reached through the ordinary
//                  transfer paths (staged or pinned)
//
// Memory ids are stable for the life of a System: the device memories are
// 0..N-1 (memory i is device i's HBM), pinned_host is N and unpinned_host
// is N+1, whether or not the premapped region is on (with the region off
// pinned_host is listed with capacity 0 and allocating in it fails).
//
// A MemoryBuffer lives in one memory. In device memory it is a
// DeviceBuffer (MemoryBuffer::device_buffer()); in a host memory its bytes
// are at data(). A shaped buffer (DeviceBufferSpec) holds its array in the
// device's tiled layout in every memory, host memories included, so a copy
// between device and pinned_host is one DMA of the same bytes; a host that
// wants the dense row-major array uses System::TransferArrayFromDevice.
//
// Thread-safety: MemoryBuffer is a shared handle (copies refer to one
// buffer), safe to copy and use from any thread; the structs are values.
//
//   const int pinned = system->memory_of_kind(MemoryKind::kPinnedHost);
//   TPUSHIM_ASSIGN_OR_RETURN(tpushim::MemoryBuffer host,
//                            system->AllocateInMemory(pinned, n));
//   TPUSHIM_ASSIGN_OR_RETURN(tpushim::MemoryCopy up,
//                            system->CopyToMemory(host, /*memory=*/0));
//   TPUSHIM_RETURN_IF_ERROR(up.event.Await());  // up.buffer is on device 0

#ifndef TPUSHIM_MEMORY_H_
#define TPUSHIM_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "tpushim/export.h"
#include "tpushim/transfer.h"

namespace tpushim {

enum class MemoryKind : int {
  kDevice = 0,
  kPinnedHost = 1,
  kUnpinnedHost = 2,
};
// PJRT's kind strings: "device", "pinned_host", "unpinned_host".
TPUSHIM_EXPORT absl::string_view MemoryKindName(MemoryKind kind);

// One memory of a System (PJRT's PJRT_Memory).
struct MemoryDescription {
  int id = 0;  // stable, see above
  MemoryKind kind = MemoryKind::kDevice;
  std::string kind_name;  // MemoryKindName(kind)
  // For logs and tools: "sim:0 HBM", "pinned_host (premapped region)",
  // "unpinned_host".
  std::string description;
  // The devices that address it: its own device for device memory, every
  // device for the host memories.
  std::vector<int> devices;
  // Bytes it can hold: the HBM size, the region's size (0 when it is off),
  // 0 for unpinned_host (no limit of its own).
  uint64_t capacity_bytes = 0;
};

// One memory's statistics, with PJRT's Device_MemoryStats fields.
struct MemoryStats {
  int memory = 0;
  MemoryKind kind = MemoryKind::kDevice;
  // Device memory: the live buffers' sizes in their layouts. pinned_host:
  // what the region holds (its buffers and the transfers' staging buffers).
  // unpinned_host: the live buffers in it (aliased caller memory included).
  uint64_t bytes_in_use = 0;
  uint64_t peak_bytes_in_use = 0;  // since the system was created
  // Buffers allocated in it since the system was created, and the largest
  // one. pinned_host counts AllocatePinnedHost's buffers too; staging
  // buffers, and buffers that alias caller memory, are not allocations.
  uint64_t num_allocs = 0;
  uint64_t largest_alloc_size = 0;
  // Capacity; has_bytes_limit is false for unpinned_host (bytes_limit 0).
  bool has_bytes_limit = true;
  uint64_t bytes_limit = 0;
  uint64_t largest_free_block_bytes = 0;  // 0 for unpinned_host
  uint64_t buffers_live = 0;  // live MemoryBuffers and DeviceBuffers in it
};

namespace memory_internal {
struct BufferState;
}  // namespace memory_internal

// A buffer in one memory. Copies share one buffer; System::Free frees it
// (or the system, when it goes). Host bytes that alias the caller's memory
// (the zero-copy semantics) stay the caller's: freeing only forgets them.
class TPUSHIM_EXPORT MemoryBuffer {
 public:
  MemoryBuffer() = default;  // refers to nothing; every call rejects it

  bool valid() const { return state_ != nullptr; }
  int memory() const;
  MemoryKind kind() const;
  // Bytes it occupies in its memory: a shaped buffer's tiled image,
  // padding included (in device memory, DeviceBuffer::size()).
  uint64_t size() const;
  // Host memories: the buffer's bytes (valid until it is freed). Null in
  // device memory.
  void* data() const;
  // Device memory: the DeviceBuffer it is (every DeviceBuffer call takes
  // it). Invalid in a host memory.
  DeviceBuffer device_buffer() const;
  // Whether its bytes are the caller's (made with a zero-copy semantics
  // over memory that allowed it), and whether writable so (kMutableZeroCopy).
  bool aliases_caller_memory() const;
  bool mutable_alias() const;
  // Shaped buffers (as DeviceBuffer's; empty / equal to size() otherwise).
  std::string shape() const;
  uint64_t unpadded_size() const;
  uint64_t host_size() const;  // the dense row-major array
  std::string label() const;

  // The runtime's side of the handle (driver/memory_spaces.h); opaque here.
  const std::shared_ptr<memory_internal::BufferState>& state() const {
    return state_;
  }
  explicit MemoryBuffer(std::shared_ptr<memory_internal::BufferState> state)
      : state_(std::move(state)) {}

 private:
  std::shared_ptr<memory_internal::BufferState> state_;
};

// What CopyToMemory and CreateMemoryBuffer return: the new buffer and the
// event of the copy (the buffer's bytes are valid once it is ready with
// OK; System::BufferReadyEvent(buffer) answers the same later).
struct MemoryCopy {
  MemoryBuffer buffer;
  Event event;
  // When the caller's host bytes are free again (PJRT's
  // done_with_host_buffer). CreateMemoryBuffer into device memory: the
  // transfer's host_released (TransferEvents: on the staged path once the
  // last byte is in staging, before `event`; otherwise with it). A buffer
  // that aliases the caller's bytes (a zero-copy semantics): once the
  // buffer is freed and the copies using it are done (CANCELLED if its
  // system goes first: the system then no longer uses them either). Copied
  // into a host memory: ready with OK at once. CopyToMemory (no caller
  // bytes): `event`.
  Event host_released;
};

}  // namespace tpushim

#endif  // TPUSHIM_MEMORY_H_
