// What the C ABI's functions share (driver/c_api.cc, driver/c_api_shaped.cc):
// the error type, the call guard, the args check, the handle tables and
// the running-call hold on a system. Internal to the driver; the design is
// described at the top of driver/c_api.cc.

#ifndef TPUSHIM_DRIVER_C_API_SUPPORT_H_
#define TPUSHIM_DRIVER_C_API_SUPPORT_H_

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "env/fork_guard.h"
#include "env/os.h"
#include "tpushim/c_api.h"
#include "tpushim/system.h"

struct TpuShim_Error {
  absl::Status status;
  std::string message;  // status.message(), NUL-terminated
};

namespace tpushim::capi_internal {

// ---- Errors -----------------------------------------------------------------

inline TpuShim_Error* NewError(absl::Status status) {
  std::string message(status.message());
  return new TpuShim_Error{std::move(status), std::move(message)};
}

// Returned when an error cannot be allocated; never freed.
inline TpuShim_Error* const kOutOfMemoryError =
    NewError(absl::ResourceExhaustedError(
        "tpushim C API: out of host memory (operator new failed)"));

inline TpuShim_Error* ToError(absl::Status status) noexcept {
  if (status.ok()) return nullptr;
  try {
    return NewError(std::move(status));
  } catch (...) {
    return kOutOfMemoryError;
  }
}

// Runs one API call: no exception crosses into C.
template <typename F>
inline TpuShim_Error* Guard(F&& f) noexcept {
  absl::Status status;
  try {
    status = f();
  } catch (const std::bad_alloc&) {
    return kOutOfMemoryError;
  } catch (const std::exception& e) {
    status = absl::InternalError(
        absl::StrCat("tpushim C API: unexpected exception: ", e.what()));
  } catch (...) {
    status = absl::InternalError("tpushim C API: unexpected exception");
  }
  return ToError(std::move(status));
}

// The args pointer and its struct_size (see "Versioning" above).
template <typename Args>
inline absl::Status CheckArgs(const Args* args, absl::string_view function,
                              size_t v1_size, absl::string_view size_macro) {
  if (args == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(function, ": the args pointer is NULL"));
  }
  if (args->struct_size < v1_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        function, ": args->struct_size is ", args->struct_size,
        ", smaller than the API 1.0 size ", v1_size, " (", size_macro, ")"));
  }
  return absl::OkStatus();
}

#define TPUSHIM_CHECK_ARGS(args, function, size_macro) \
  TPUSHIM_RETURN_IF_ERROR(CheckArgs(args, function, size_macro, #size_macro))

// ---- Handle tables ----------------------------------------------------------

enum class Kind : uint8_t {
  kSystem = 'S',
  kHostBuffer = 'H',
  kDeviceBuffer = 'D',
  kEvent = 'E',
  kMemoryBuffer = 'M',  // 1.4: memory kinds
  kHostRegistration = 'R',
};

inline absl::string_view KindName(uint64_t tag) {
  switch (static_cast<Kind>(tag)) {
    case Kind::kSystem:
      return "TpuShim_System";
    case Kind::kHostBuffer:
      return "TpuShim_HostBuffer";
    case Kind::kDeviceBuffer:
      return "TpuShim_DeviceBuffer";
    case Kind::kEvent:
      return "TpuShim_Event";
    case Kind::kMemoryBuffer:
      return "TpuShim_MemoryBuffer";
    case Kind::kHostRegistration:
      return "TpuShim_HostRegistration";
  }
  return "";
}

inline constexpr int kKindShift = 56;
inline constexpr int kSlotShift = 32;
inline constexpr uint64_t kSlotMask =
    (uint64_t{1} << (kKindShift - kSlotShift)) - 1;
inline constexpr uint64_t kGenerationMask = (uint64_t{1} << kSlotShift) - 1;

inline absl::Status InvalidHandle(Kind kind, uint64_t id,
                                  absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("Invalid %s handle 0x%016x: %s",
                      KindName(static_cast<uint64_t>(kind)), id, why));
}

// Live entries of one kind, by id. T is a copyable value (a shared handle).
template <typename T>
class HandleTable {
 public:
  explicit HandleTable(Kind kind) : kind_(kind) {}
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;

  // A slot held for an entry to come. No call sees it (its id is "not an
  // id this library issued") until Fill; destroyed unfilled, it goes back
  // to the table. A call that queues work reserves first, so that a full
  // table refuses it before anything runs, and fills after.
  class Reservation {
   public:
    Reservation(Reservation&& other) noexcept
        : table_(std::exchange(other.table_, nullptr)), slot_(other.slot_) {}
    Reservation& operator=(Reservation&&) = delete;
    ~Reservation() {
      if (table_ != nullptr) table_->Release(slot_);
    }
    // Makes `value` the slot's entry and returns its id. Cannot fail.
    uint64_t Fill(T value) && noexcept {
      HandleTable* table = std::exchange(table_, nullptr);
      return table->FillSlot(slot_, std::move(value));
    }

   private:
    friend class HandleTable;
    Reservation(HandleTable* table, uint64_t slot)
        : table_(table), slot_(slot) {}
    HandleTable* table_;
    uint64_t slot_;
  };

  // A slot for an entry to come. RESOURCE_EXHAUSTED when the table's
  // capacity (2^24) is live or reserved, or when every slot index is live,
  // reserved or retired (see Free).
  absl::StatusOr<Reservation> Reserve() {
    MutexLock lock(&mu_);
    uint64_t slot;
    if (in_use_ >= capacity_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("tpushim C API: ", capacity_, " ",
                       KindName(static_cast<uint64_t>(kind_)),
                       " handles are live; destroy some first"));
    }
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else if (slots_.size() > kSlotMask) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tpushim C API: all ", kSlotMask + 1, " ",
          KindName(static_cast<uint64_t>(kind_)),
          " slots are live or retired (a slot retires after 2^32 - 1 "
          "handles, so that no handle is ever issued twice)"));
    } else {
      // Fewer than 2^24 slots exist: the index fits.
      slot = slots_.size();
      slots_.emplace_back();
      // Room to give every slot back without allocating (Release and
      // Free cannot fail).
      free_.reserve(slots_.size());
    }
    ++in_use_;
    return Reservation(this, slot);
  }

  // A new id for `value`. RESOURCE_EXHAUSTED as Reserve.
  absl::StatusOr<uint64_t> Insert(T value) {
    TPUSHIM_ASSIGN_OR_RETURN(Reservation r, Reserve());
    return std::move(r).Fill(std::move(value));
  }

  // Test only: at most `capacity` entries live or reserved (entries
  // beyond it stay valid; none is added until some are freed). 0
  // restores 2^24.
  void TEST_SetCapacity(uint64_t capacity) {
    MutexLock lock(&mu_);
    capacity_ =
        capacity == 0 || capacity > kSlotMask + 1 ? kSlotMask + 1 : capacity;
  }
  uint64_t TEST_InUse() const {
    MutexLock lock(&mu_);
    return in_use_;
  }
  // Test only: the free slot of the freed id `id` is next issued with
  // `generation` (not below its own), so that a test reaches the last
  // generation without 2^32 reuses. False, changing nothing, when `id`'s
  // slot is live or reserved, or `generation` is out of range.
  bool TEST_SetGeneration(uint64_t id, uint64_t generation) {
    MutexLock lock(&mu_);
    const uint64_t slot = (id >> kSlotShift) & kSlotMask;
    if (id >> kKindShift != static_cast<uint64_t>(kind_) ||
        slot >= slots_.size() || generation > kGenerationMask ||
        generation < slots_[slot].generation ||
        std::find(free_.begin(), free_.end(), slot) == free_.end()) {
      return false;
    }
    slots_[slot].generation = generation;
    return true;
  }

  // A copy of the entry of `id`.
  absl::StatusOr<T> Get(uint64_t id) const {
    MutexLock lock(&mu_);
    TPUSHIM_ASSIGN_OR_RETURN(const Slot* s, Find(id));
    return *s->value;
  }

  // Removes the entry of `id` and returns it, if `check(entry)` is OK;
  // otherwise returns check's error and leaves the entry.
  absl::StatusOr<T> Take(uint64_t id,
                         absl::FunctionRef<absl::Status(const T&)> check) {
    MutexLock lock(&mu_);
    TPUSHIM_ASSIGN_OR_RETURN(const Slot* found, Find(id));
    TPUSHIM_RETURN_IF_ERROR(check(*found->value));
    Slot& s = slots_[(id >> kSlotShift) & kSlotMask];
    T value = *std::move(s.value);
    Free(s, (id >> kSlotShift) & kSlotMask);
    return value;
  }

  // Removes and returns every entry `pred` accepts.
  std::vector<T> TakeAll(absl::FunctionRef<bool(const T&)> pred) {
    std::vector<T> taken;
    MutexLock lock(&mu_);
    for (uint64_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (s.value.has_value() && pred(*s.value)) {
        taken.push_back(*std::move(s.value));
        Free(s, i);
      }
    }
    return taken;
  }

 private:
  struct Slot {
    // The generation the slot's next (or current) id carries; beyond
    // kGenerationMask once the slot is retired.
    uint64_t generation = 1;
    std::optional<T> value;
  };

  absl::StatusOr<const Slot*> Find(uint64_t id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (id == 0) return InvalidHandle(kind_, id, "no handle (id 0)");
    const uint64_t tag = id >> kKindShift;
    if (tag != static_cast<uint64_t>(kind_)) {
      const absl::string_view other = KindName(tag);
      return InvalidHandle(kind_, id,
                           other.empty()
                               ? "not an id this library issued"
                               : absl::StrCat("it is a ", other, " handle"));
    }
    const uint64_t slot = (id >> kSlotShift) & kSlotMask;
    const uint64_t generation = id & kGenerationMask;
    if (slot >= slots_.size() || generation == 0 ||
        generation > slots_[slot].generation ||
        (generation == slots_[slot].generation &&
         !slots_[slot].value.has_value())) {
      return InvalidHandle(kind_, id, "not an id this library issued");
    }
    if (generation < slots_[slot].generation) {
      return InvalidHandle(kind_, id,
                           "stale (already freed or destroyed, or its "
                           "system was destroyed)");
    }
    return &slots_[slot];
  }

  uint64_t FillSlot(uint64_t slot, T value) noexcept {
    MutexLock lock(&mu_);
    Slot& s = slots_[slot];
    s.value = std::move(value);
    return (static_cast<uint64_t>(kind_) << kKindShift) | (slot << kSlotShift) |
           s.generation;
  }

  // A reserved slot back, unfilled: its id was never seen, so its
  // generation stays.
  void Release(uint64_t slot) noexcept {
    MutexLock lock(&mu_);
    free_.push_back(slot);  // never allocates (Reserve made room)
    --in_use_;
  }

  // Generations never wrap: a slot whose last generation (2^32 - 1) is
  // freed retires (stays out of free_ for good, its ids all stale), so no
  // id is issued twice and a stale handle can never match a live one, in
  // a run of any length. Wrapping instead would let a loop of
  // create/destroy, which reuses one slot (free_ is last-in-first-out),
  // bring a stale id back to life after 2^32 reuses: 2.4 hours at the
  // ~500,000 pairs per second measured. What retiring costs: one slot (a
  // few dozen bytes) per 2^32 - 1 frees — about 3,700 slots a year of such a
  // loop — and the 2^24 slot indices last 2^56 frees, some 4,500 years at
  // that rate (then Reserve says so, RESOURCE_EXHAUSTED). Free slots stay
  // last-in-first-out: the slot reused is the one in cache.
  void Free(Slot& s, uint64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    s.value.reset();
    ++s.generation;
    if (s.generation <= kGenerationMask) free_.push_back(slot);
    --in_use_;
  }

  // Constant after construction.
  const Kind kind_;
  // Protected by mu_.
  mutable Mutex mu_;

  friend struct Tables;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> free_ ABSL_GUARDED_BY(mu_);
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;  // live or reserved
  uint64_t capacity_ ABSL_GUARDED_BY(mu_) = kSlotMask + 1;
};

// A system and the calls running on it.
struct SystemEntry {
  explicit SystemEntry(std::unique_ptr<System> s) : system(std::move(s)) {}

  // The process that created the system: a fork() child's System_Destroy
  // waits for no call (the calls running at fork() stayed in the parent).
  const pid_t pid = CurrentProcessId();

  // Constant until System_Destroy, which resets it once no call runs.
  std::unique_ptr<System> system;

  Mutex mu;
  CondVar idle;
  int active ABSL_GUARDED_BY(mu) = 0;
  bool closing ABSL_GUARDED_BY(mu) = false;
};

struct HostBufferEntry {
  uint64_t system_id = 0;
  PinnedHostBuffer buffer;
};

struct HostRegistrationEntry {
  uint64_t system_id = 0;
  HostRegistration registration;
};

struct DeviceBufferEntry {
  uint64_t system_id = 0;
  DeviceBuffer buffer;
  // Borrowed from a TpuShim_MemoryBuffer in device memory
  // (MemoryBuffer_GetInfo): freed with it, never by DeviceBuffer_Deallocate.
  bool borrowed = false;
};

struct EventEntry {
  uint64_t system_id = 0;
  Event event;
  // Events from Event_Create: what sets them. Its last copy going (the
  // handle destroyed unset) fails the event with CANCELLED.
  std::shared_ptr<CallerEvent> setter{};
};

struct MemoryBufferEntry {
  uint64_t system_id = 0;
  MemoryBuffer buffer;
  // Device memory: the id of its borrowed TpuShim_DeviceBuffer handle,
  // made with the entry and made stale with it (0 in a host memory).
  uint64_t device_handle = 0;
};

struct Tables {
  HandleTable<std::shared_ptr<SystemEntry>> systems{Kind::kSystem};
  HandleTable<std::shared_ptr<HostBufferEntry>> host_buffers{Kind::kHostBuffer};
  HandleTable<DeviceBufferEntry> device_buffers{Kind::kDeviceBuffer};
  HandleTable<EventEntry> events{Kind::kEvent};
  HandleTable<MemoryBufferEntry> memory_buffers{Kind::kMemoryBuffer};
  HandleTable<std::shared_ptr<HostRegistrationEntry>> host_registrations{
      Kind::kHostRegistration};

  // fork() holds every table's lock, so that a child finds them consistent
  // and free whatever another thread was doing (pthread_atfork).
  void LockAll() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    systems.mu_.Lock();
    host_buffers.mu_.Lock();
    device_buffers.mu_.Lock();
    events.mu_.Lock();
    memory_buffers.mu_.Lock();
    host_registrations.mu_.Lock();
  }
  void UnlockAll() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    host_registrations.mu_.Unlock();
    memory_buffers.mu_.Unlock();
    events.mu_.Unlock();
    device_buffers.mu_.Unlock();
    host_buffers.mu_.Unlock();
    systems.mu_.Unlock();
  }
};

// Never destroyed: callbacks and other threads may use the tables while the
// process exits.
inline Tables& tables() {
  static Tables* const t = [] {
    auto* made = new Tables;
    pthread_atfork([] { tables().LockAll(); }, [] { tables().UnlockAll(); },
                   [] { tables().UnlockAll(); });
    return made;
  }();
  return *t;
}

inline std::atomic<Os*> test_os{nullptr};

// Set while a C callback runs on a system's callback thread: that system's
// id (System_Destroy refuses it there).
inline thread_local uint64_t tls_callback_system = 0;
// Set while Event_AddCallback runs on this thread: a callback that runs
// then runs inline (the event was ready), not on a callback thread.
inline thread_local int tls_adding_callback = 0;

// A running call on a system: holds the system open (System_Destroy waits
// for it).
class SystemCall {
 public:
  static absl::StatusOr<SystemCall> Enter(TpuShim_System handle) {
    TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<SystemEntry> entry,
                             tables().systems.Get(handle.id));
    {
      MutexLock lock(&entry->mu);
      if (entry->closing) {
        return InvalidHandle(Kind::kSystem, handle.id,
                             "stale (the system is being destroyed)");
      }
      ++entry->active;
    }
    return SystemCall(std::move(entry), handle.id);
  }

  SystemCall(SystemCall&& other) noexcept
      : entry_(std::move(other.entry_)), id_(other.id_) {}
  SystemCall& operator=(SystemCall&&) = delete;
  ~SystemCall() {
    if (entry_ == nullptr) return;
    MutexLock lock(&entry_->mu);
    if (--entry_->active == 0) entry_->idle.SignalAll();
  }

  System& system() const { return *entry_->system; }
  // The system's handle id.
  uint64_t id() const { return id_; }

 private:
  SystemCall(std::shared_ptr<SystemEntry> entry, uint64_t id)
      : entry_(std::move(entry)), id_(id) {}
  std::shared_ptr<SystemEntry> entry_;
  uint64_t id_;
};

inline absl::Status Foreign(Kind kind, uint64_t id) {
  return InvalidHandle(kind, id, "it belongs to another TpuShim_System");
}

inline absl::StatusOr<DeviceBuffer> GetDeviceBuffer(
    const SystemCall& call, TpuShim_DeviceBuffer handle) {
  TPUSHIM_ASSIGN_OR_RETURN(DeviceBufferEntry entry,
                           tables().device_buffers.Get(handle.id));
  if (entry.system_id != call.id()) {
    return Foreign(Kind::kDeviceBuffer, handle.id);
  }
  return std::move(entry.buffer);
}

// The events of a wait_for list, all of the call's system.
inline absl::StatusOr<std::vector<Event>> GetWaitFor(
    const SystemCall& call, absl::string_view function,
    const TpuShim_Event* wait_for, size_t num_wait_for) {
  std::vector<Event> events;
  if (num_wait_for == 0) return events;
  if (wait_for == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(function, ": args->wait_for is NULL and num_wait_for is ",
                     num_wait_for));
  }
  for (size_t i = 0; i < num_wait_for; ++i) {
    absl::StatusOr<EventEntry> entry = tables().events.Get(wait_for[i].id);
    if (entry.ok() && entry->system_id != call.id()) {
      entry = Foreign(Kind::kEvent, wait_for[i].id);
    }
    if (!entry.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          entry.status().message(), " (", function, ": wait_for[", i, "])"));
    }
    events.push_back(std::move(entry->event));
  }
  return events;
}

using EventReservation = HandleTable<EventEntry>::Reservation;

// Submits work whose event the caller gets: the event's handle is
// reserved first, so a full table (RESOURCE_EXHAUSTED) refuses the call
// before `submit` queues anything, and a failed submission gives the
// handle back. c_api.h promises that a call that fails queued nothing.
inline absl::Status SubmitWithEvent(
    uint64_t system_id, TpuShim_Event* out,
    absl::FunctionRef<absl::StatusOr<Event>()> submit) {
  TPUSHIM_ASSIGN_OR_RETURN(EventReservation slot, tables().events.Reserve());
  TPUSHIM_ASSIGN_OR_RETURN(Event event, submit());
  out->id = std::move(slot).Fill(EventEntry{system_id, std::move(event)});
  return absl::OkStatus();
}

// The same for a host→device transfer with two events: `released_out`
// (null when the caller's struct has no room for it) gets host_released.
// Both handles (one when released_out is null) are reserved before
// anything is queued.
inline absl::Status SubmitWithEvents(
    uint64_t system_id, TpuShim_Event* ready_out, TpuShim_Event* released_out,
    absl::FunctionRef<absl::StatusOr<TransferEvents>()> submit) {
  TPUSHIM_ASSIGN_OR_RETURN(EventReservation ready, tables().events.Reserve());
  std::optional<EventReservation> released;
  if (released_out != nullptr) {
    TPUSHIM_ASSIGN_OR_RETURN(EventReservation slot, tables().events.Reserve());
    released.emplace(std::move(slot));
  }
  TPUSHIM_ASSIGN_OR_RETURN(TransferEvents events, submit());
  ready_out->id =
      std::move(ready).Fill(EventEntry{system_id, std::move(events.ready)});
  if (released.has_value()) {
    released_out->id = std::move(*released).Fill(
        EventEntry{system_id, std::move(events.host_released)});
  }
  return absl::OkStatus();
}

// `semantics` is an int32_t: a C caller may put any value there.
inline absl::StatusOr<HostBufferSemantics> ToSemantics(
    int32_t semantics, absl::string_view function) {
  switch (semantics) {
    case TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL:
      return HostBufferSemantics::kImmutableOnlyDuringCall;
    case TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES:
      return HostBufferSemantics::kImmutableUntilTransferCompletes;
    case TPUSHIM_HOST_BUFFER_IMMUTABLE_ZERO_COPY:
      return HostBufferSemantics::kImmutableZeroCopy;
    case TPUSHIM_HOST_BUFFER_MUTABLE_ZERO_COPY:
      return HostBufferSemantics::kMutableZeroCopy;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(function, ": args->semantics ", semantics,
                       " is not a TpuShim_HostBufferSemantics value"));
  }
}

// c_api.h makes a transfer of 0 bytes INVALID_ARGUMENT; the C++ API, which
// the adapter calls, accepts one (its event is ready at once).
inline absl::Status CheckTransferSize(uint64_t size,
                                      absl::string_view function) {
  if (size != 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      function, ": args->size is 0; a transfer moves at least 1 byte"));
}

// A host→device byte transfer's call (Transfer_ToDevice, Transfer_Chunk),
// checked and looked up: `src` not NULL, `size` not 0, `semantics` a
// value, then the system entered, `dst` and the wait_for list resolved.
struct ToDeviceCall {
  SystemCall call;
  DeviceBuffer dst;
  std::vector<Event> wait_for;
  HostBufferSemantics semantics;
};
template <typename Args>
inline absl::StatusOr<ToDeviceCall> EnterToDevice(const Args& args,
                                                  absl::string_view function) {
  if (args.src == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(function, ": args->src is NULL"));
  }
  TPUSHIM_RETURN_IF_ERROR(CheckTransferSize(args.size, function));
  TPUSHIM_ASSIGN_OR_RETURN(HostBufferSemantics semantics,
                           ToSemantics(args.semantics, function));
  TPUSHIM_ASSIGN_OR_RETURN(SystemCall call, SystemCall::Enter(args.system));
  TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer dst, GetDeviceBuffer(call, args.dst));
  TPUSHIM_ASSIGN_OR_RETURN(
      std::vector<Event> wait_for,
      GetWaitFor(call, function, args.wait_for, args.num_wait_for));
  return ToDeviceCall{std::move(call), std::move(dst), std::move(wait_for),
                      semantics};
}

// The functions of API 1.3 (driver/c_api_shaped.cc).
TpuShim_Error* DeviceBufferAllocateShaped(
    TpuShim_DeviceBuffer_AllocateShaped_Args* args);
TpuShim_Error* SystemGetDeviceMemoryStats(
    TpuShim_System_GetDeviceMemoryStats_Args* args);
TpuShim_Error* TransferArrayToDevice(TpuShim_Transfer_ArrayToDevice_Args* args);
TpuShim_Error* TransferArrayFromDevice(
    TpuShim_Transfer_ArrayFromDevice_Args* args);

// 1.4: memory kinds (driver/c_api_memory.cc).
TpuShim_Error* SystemGetMemories(TpuShim_System_GetMemories_Args* args);
TpuShim_Error* SystemGetDefaultMemory(
    TpuShim_System_GetDefaultMemory_Args* args);
TpuShim_Error* MemoryBufferAllocate(TpuShim_MemoryBuffer_Allocate_Args* args);
TpuShim_Error* MemoryBufferFromHost(TpuShim_MemoryBuffer_FromHost_Args* args);
TpuShim_Error* MemoryBufferCopyToMemory(
    TpuShim_MemoryBuffer_CopyToMemory_Args* args);
TpuShim_Error* MemoryBufferGetInfo(TpuShim_MemoryBuffer_GetInfo_Args* args);
TpuShim_Error* MemoryBufferFree(TpuShim_MemoryBuffer_Free_Args* args);
TpuShim_Error* SystemGetMemoryStats(TpuShim_System_GetMemoryStats_Args* args);
TpuShim_Error* MemoryBufferReadyEvent(
    TpuShim_MemoryBuffer_ReadyEvent_Args* args);
// The functions of API 1.4: events (driver/c_api_events.cc).
TpuShim_Error* EventCreate(TpuShim_Event_Create_Args* args);
TpuShim_Error* EventSet(TpuShim_Event_Set_Args* args);
TpuShim_Error* DeviceBufferReadyEvent(
    TpuShim_DeviceBuffer_ReadyEvent_Args* args);
TpuShim_Error* TransferBeginChunked(TpuShim_Transfer_BeginChunked_Args* args);
TpuShim_Error* TransferChunk(TpuShim_Transfer_Chunk_Args* args);
TpuShim_Error* TransferAbortChunked(TpuShim_Transfer_AbortChunked_Args* args);
// 1.4: registered host memory (driver/c_api_registered.cc).
TpuShim_Error* HostMemoryRegister(TpuShim_HostMemory_Register_Args* args);
TpuShim_Error* HostMemoryUnregister(TpuShim_HostMemory_Unregister_Args* args);

}  // namespace tpushim::capi_internal

#endif  // TPUSHIM_DRIVER_C_API_SUPPORT_H_
