// The vocabulary of transfers: directions, paths, host-buffer semantics,
// events and device buffers (see docs/transfers.md).
//
// Thread-safety: the enums and their names are constants; Event and
// DeviceBuffer are shared handles, safe to copy and use from any thread.

#ifndef TPUSHIM_TRANSFER_H_
#define TPUSHIM_TRANSFER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tpushim/export.h"

namespace tpushim {

enum class DmaDirection : uint8_t {
  kHostToDevice = 0,
  kDeviceToHost = 1,
  kDeviceToDevice = 2,
};
inline constexpr int kDmaDirectionCount = 3;
// "h2d", "d2h", "d2d" (stats keys, trace names, the tools' JSON).
TPUSHIM_EXPORT absl::string_view DmaDirectionName(DmaDirection direction);
// "host→device", "device→host", "device→device" (log lines).
TPUSHIM_EXPORT absl::string_view DmaDirectionDescription(
    DmaDirection direction);

// When the caller may reuse its host buffer, from most to least restrictive
// for the engine (PJRT's HostBufferSemantics).
enum class HostBufferSemantics {
  // The engine is done with the host buffer when the call returns: a staged
  // host→device transfer returns once its bytes are in staging buffers;
  // every other transfer returns once it has completed (which, with
  // `wait_for`, includes waiting for those events). The caller may then
  // reuse or free the buffer at once.
  kImmutableOnlyDuringCall,
  // The caller keeps the buffer valid — and, host→device, unchanged;
  // device→host, untouched — until the transfer's event is ready. The call
  // returns at once; the engine may DMA straight from/to the buffer later.
  kImmutableUntilTransferCompletes,
  // PJRT's two zero-copy semantics, for a host-memory buffer made over the
  // caller's bytes (System::CreateMemoryBuffer): the buffer may alias them
  // instead of copying (docs/api.md says when it does). The caller keeps
  // them valid until the buffer is freed, and does not change them.
  kImmutableZeroCopy,
  // As kImmutableZeroCopy, and the buffer's memory is the caller's bytes:
  // what is copied into the buffer lands there. The caller neither reads
  // nor writes them until the buffer's copies are done.
  kMutableZeroCopy,
  // Given to a transfer (TransferToDevice, ...), the two zero-copy values
  // mean kImmutableUntilTransferCompletes: a transfer never outlives its
  // event.
};
TPUSHIM_EXPORT absl::string_view HostBufferSemanticsName(
    HostBufferSemantics semantics);

enum class TransferPath : int { kZeroCopy = 0, kStaged = 1, kPinned = 2 };
inline constexpr int kTransferPathCount = 3;
// "zero_copy", "staged", "pinned".
TPUSHIM_EXPORT absl::string_view TransferPathName(TransferPath path);

namespace transfer_internal {
class Engine;
class EventState;
class CallerEventHub;
struct Allocation;
}  // namespace transfer_internal

// The completion of one asynchronous operation (a transfer, a
// deallocation), with tpu_driver's semantics: it becomes ready exactly
// once, with a status; it can be awaited, with or without a timeout;
// callbacks added to it run once it is ready.
//
// Where callbacks run: a callback added to a pending event runs, after the
// event becomes ready, on the system's callback thread — never on a DMA
// thread and never under an engine lock — in the order callbacks became
// runnable. A callback added to an event that is already ready runs at
// once on the calling thread. Callbacks should be short: they share one
// thread. They may call back into the system (Shutdown included). They
// should not throw: an exception a callback throws is logged at ERROR and
// dropped, on either thread (it never reaches AddCallback's caller), and
// the callbacks after it still run.
//
// Awaiting a small transfer polls for a few microseconds before it sleeps,
// so it does not pay a thread wake-up.
//
// A cheap, copyable, shared handle; thread-safe. A default-constructed
// Event is ready with OK (convenient in `wait_for` lists).
class TPUSHIM_EXPORT Event {
 public:
  // Ready, with OK.
  Event();
  explicit Event(std::shared_ptr<transfer_internal::EventState> state)
      : state_(std::move(state)) {}

  // An event that is already ready with `status`.
  static Event Ready(absl::Status status);

  bool IsReady() const;
  // Blocks until ready; returns the status.
  absl::Status Await() const;
  // The status if the event became ready within `timeout`, else nullopt.
  std::optional<absl::Status> AwaitWithTimeout(absl::Duration timeout) const;
  // Runs `callback(status)` once the event is ready (see above for where).
  void AddCallback(absl::AnyInvocable<void(absl::Status) &&> callback) const;

  const std::shared_ptr<transfer_internal::EventState>& state() const {
    return state_;
  }

 private:
  std::shared_ptr<transfer_internal::EventState> state_;
};

// The two events of a host→device transfer (docs/transfers.md):
//  * `ready`: the bytes are on the device (the transfer's event);
//  * `host_released`: the engine no longer reads the caller's buffer,
//    which may be reused or freed. Staged (through the region or the
//    bounce pool): once the last byte is copied into staging, before the
//    DMA ends. Zero-copy and pinned: together with `ready` (the device
//    reads the caller's memory until then). It is never ready later than
//    `ready`. Its status: OK when every byte was read from the caller's
//    buffer (even if the DMA fails afterwards: the buffer is free all the
//    same, and `ready` carries the failure); otherwise — a failed
//    dependency, shutdown before the start, a failure while copying —
//    the transfer's failure, as `ready`.
struct TransferEvents {
  Event ready;
  Event host_released;
};

// An event the caller makes (System::CreateEvent) and sets later, with a
// status (PJRT's Event_Create / Event_Set). Until set it is pending: its
// event() works wherever an Event does — `wait_for` lists of its own
// system, Await, callbacks.
//
// Set it once: a second Set is FAILED_PRECONDITION ("already set") and
// changes nothing. Destroying the CallerEvent before setting it fails the
// event with CANCELLED, so that no waiter waits forever; so does shutting
// its system down (a Set after that is FAILED_PRECONDITION). A
// CallerEvent may outlive its system.
//
// Move-only; thread-safe (Set may race with waiters on any thread; two
// racing Sets: one wins, the other is FAILED_PRECONDITION).
class TPUSHIM_EXPORT CallerEvent {
 public:
  CallerEvent() = default;  // refers to nothing: Set is FAILED_PRECONDITION
  CallerEvent(CallerEvent&& other) noexcept = default;
  CallerEvent& operator=(CallerEvent&& other) noexcept;
  CallerEvent(const CallerEvent&) = delete;
  CallerEvent& operator=(const CallerEvent&) = delete;
  ~CallerEvent();

  // The event waiters use; a copy of it lives on after the CallerEvent.
  const Event& event() const { return event_; }
  // Makes the event ready with `status`: wakes its waiters, starts the
  // operations waiting for it (or fails them with a failed `status`) and
  // posts its callbacks to the system's callback thread.
  absl::Status Set(absl::Status status);

 private:
  friend class transfer_internal::Engine;
  CallerEvent(std::shared_ptr<transfer_internal::CallerEventHub> hub,
              Event event)
      : hub_(std::move(hub)), event_(std::move(event)) {}
  // Fails a pending event with CANCELLED (destroyed before set).
  void Abandon();

  std::shared_ptr<transfer_internal::CallerEventHub> hub_;
  Event event_;
};

// What a shaped device buffer holds: one XLA array (docs/shapes.md).
struct DeviceBufferSpec {
  // XLA's shape string of one array, e.g. "f32[1024,1000]" or
  // "bf16[8,128]{1,0:T(8,128)(2,1)}"; without a layout the TPU default.
  std::string shape{};
  // Its name in memory reports ("XLA label:") and the memory profile.
  std::string label{};
  // The operation that made it ("Operator:"), e.g.
  // op_type="OneHot" op_name="model/loss/one_hot"; may be empty.
  std::string op_metadata{};
};

// A device-memory buffer. Copies share one buffer; it is freed by
// Deallocate (or when its system goes), not when the last copy goes.
class TPUSHIM_EXPORT DeviceBuffer {
 public:
  DeviceBuffer() = default;  // refers to nothing; every call rejects it

  int device() const;
  // Bytes of device memory it covers: for a shaped buffer, the array in
  // its tiled layout, padding included (on a device that moves whole
  // blocks, NVMe's, rounded up to a block; the rest reads as zero).
  uint64_t size() const;
  uint64_t device_address() const;
  bool valid() const { return allocation_ != nullptr; }

  // Shaped buffers (empty / equal to size() for a byte buffer):
  // the shape with the layout used, e.g. "f32[1024,1000]{1,0:T(8,128)}";
  std::string shape() const;
  // the bytes of its elements without padding;
  uint64_t unpadded_size() const;
  // the bytes of the dense row-major array a host holds;
  uint64_t host_size() const;
  // the caller's label and op metadata.
  std::string label() const;
  std::string op_metadata() const;

 private:
  friend class transfer_internal::Engine;
  explicit DeviceBuffer(std::shared_ptr<transfer_internal::Allocation> a)
      : allocation_(std::move(a)) {}
  std::shared_ptr<transfer_internal::Allocation> allocation_;
};

}  // namespace tpushim

#endif  // TPUSHIM_TRANSFER_H_
