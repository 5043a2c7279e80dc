// The host-memory half of a PJRT plugin, on tpushim's C++ API: what a
// plugin's PJRT_Client_BufferFromHostBuffer, PJRT_Buffer_ToHostBuffer,
// PJRT_Buffer_CopyToMemory, PJRT_Client_DmaMap / DmaUnmap and
// PJRT_Device_MemoryStats do, one method each (docs/pjrt.md maps every
// PJRT function to its tpushim call).
//
// Thread-safety: every method may be called from any thread (tpushim's
// System is thread-safe; the DmaMap table has its own lock).

#ifndef TPUSHIM_EXAMPLES_CPP_BACKEND_PJRT_BACKEND_H_
#define TPUSHIM_EXAMPLES_CPP_BACKEND_PJRT_BACKEND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tpushim/system.h"

// abseil 20220623 has no RETURN_IF_ERROR / ASSIGN_OR_RETURN.
#define BACKEND_RETURN_IF_ERROR(expr)  \
  do {                                 \
    absl::Status status_ = (expr);     \
    if (!status_.ok()) return status_; \
  } while (0)

namespace cpp_backend {

// What device_put returns: PJRT_Client_BufferFromHostBuffer's buffer and
// its two events.
struct PutResult {
  tpushim::MemoryBuffer buffer;
  // The buffer's bytes are in place (PJRT_Buffer_ReadyEvent).
  tpushim::Event ready;
  // The caller may reuse or free its host bytes (PJRT's
  // done_with_host_buffer). When the buffer aliases them it becomes ready
  // when the buffer is freed (PjrtBackend::Free): the bytes are the
  // buffer's until then.
  tpushim::Event host_released;
};

class PjrtBackend {
 public:
  // REQUIRES: `system` outlives the backend and every buffer it returns.
  explicit PjrtBackend(tpushim::System* system) : system_(system) {}
  // Unmaps what DmaMap mapped and DmaUnmap did not.
  ~PjrtBackend();

  tpushim::System& system() const { return *system_; }
  // PJRT_Device_DefaultMemory and the one memory of a host kind.
  int device_memory(int device) const;
  int pinned_host_memory() const;
  int unpinned_host_memory() const;

  // PJRT_Client_BufferFromHostBuffer for `size` bytes at `data` into
  // `memory`, with PJRT's host-buffer semantics:
  //  * device memory, kImmutableUntilTransferCompletes: a new device
  //    buffer and TransferToDeviceWithEvents (both events; a staged
  //    transfer releases `data` before its DMA ends);
  //  * anything else: CreateMemoryBuffer (kImmutableOnlyDuringCall returns
  //    once `data` may be reused; the zero-copy semantics alias `data` in
  //    a host memory that allows it).
  absl::StatusOr<PutResult> DevicePut(const void* data, uint64_t size,
                                      int memory,
                                      tpushim::HostBufferSemantics semantics);

  // PJRT_Buffer_Delete: frees `buffer` (System::Free); the event is ready
  // when it is freed. For a buffer that aliases the caller's bytes this is
  // also when DevicePut's host_released becomes ready.
  absl::StatusOr<tpushim::Event> Free(const tpushim::MemoryBuffer& buffer);

  // PJRT_Buffer_ToHostBuffer: `buffer`'s bytes into `dst` (buffer.size()
  // bytes) once `wait_for` is ready. The returned event is ready when
  // `dst` holds them. A host-memory buffer is copied by memcpy on the
  // calling thread, after waiting for `wait_for`.
  absl::StatusOr<tpushim::Event> ToHost(const tpushim::MemoryBuffer& buffer,
                                        void* dst,
                                        const tpushim::Event& wait_for);

  // PJRT_Buffer_CopyToMemory (and CopyToDevice with a device memory).
  absl::StatusOr<tpushim::MemoryCopy> CopyToMemory(
      const tpushim::MemoryBuffer& buffer, int memory,
      const tpushim::Event& wait_for);

  // PJRT_Client_DmaMap / DmaUnmap. PJRT unmaps by the pointer alone, so
  // the backend keeps each HostRegistration under its start address.
  // DmaMap: RegisterHostMemory's errors. DmaUnmap: NOT_FOUND for a pointer
  // DmaMap did not map; it waits for the transfers inside the range.
  absl::Status DmaMap(void* data, uint64_t size);
  absl::Status DmaUnmap(void* data);
  bool IsDmaMapped(const void* data) const;

  // PJRT_Device_MemoryStats: the stats of `device`'s default memory, as a
  // line ("bytes_in_use=... num_allocs=...").
  absl::StatusOr<std::string> MemoryStatsLine(int memory) const;

 private:
  tpushim::System* const system_;
  mutable std::mutex mu_;
  // Guarded by mu_: DmaMap's registrations by start address, and the
  // release events of aliasing buffers by buffer.
  std::map<const void*, tpushim::HostRegistration> mapped_;
  std::map<const void*, tpushim::CallerEvent> release_on_free_;
};

// The flows main() runs, each checking every byte it moves. Each brings
// up its own System (the batch's settings) and prints one line
// "cpp_backend: <flow>: OK: ..." on success.
absl::Status RunDevicePut();
absl::Status RunToHost();
absl::Status RunCopyToMemory();
absl::Status RunDmaMap();

// A System with the example's settings: a 16 MiB premapped region, a
// `threshold` transfer threshold and, unless TPUSHIM_DEVICE is set, two
// simulated devices with 64 MiB of HBM each.
absl::StatusOr<std::unique_ptr<tpushim::System>> MakeSystem(uint64_t threshold);

}  // namespace cpp_backend

#endif  // TPUSHIM_EXAMPLES_CPP_BACKEND_PJRT_BACKEND_H_
