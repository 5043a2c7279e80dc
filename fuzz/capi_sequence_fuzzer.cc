// Fuzz target for the C ABI (include/tpushim/c_api.h, driver/c_api.cc):
// each input is a program of up to 64 calls on small simulated systems —
// systems created and destroyed, pinned host and device buffers allocated
// and freed, transfers in every direction with `wait_for` lists, events
// polled, awaited (always bounded), given callbacks and destroyed — whose
// handles come from a table of every handle the program was given, live or
// not, so calls also get stale, freed, foreign, wrong-kind and made-up ones.
//
// Input: a byte program. Each operation is one byte naming it (the letter
// below; any other byte b is operation b % 15, in this order) followed by
// operand bytes, each read as a choice modulo a small count, so ASCII
// digits make readable seeds. A missing byte reads as 0.
//   S region thr dev link fault [p] bad     System_Create (p: with a fault)
//   X sys                                   System_Destroy
//   h sys size align                        HostBuffer_Allocate
//   f sys buf                               HostBuffer_Free
//   d sys device size                       DeviceBuffer_Allocate
//   r sys buf WAIT                          DeviceBuffer_Deallocate
//   U sys dst off size HOST sem WAIT        Transfer_ToDevice
//   D sys src off size HOST sem WAIT        Transfer_FromDevice
//   M sys src dst srcoff dstoff size WAIT   Transfer_DeviceToDevice
//   I ev                                    Event_IsReady
//   A ev                                    Event_Await (once it is ready)
//   W ev timeout                            Event_AwaitWithTimeout
//   C ev kind                               Event_AddCallback
//   E ev                                    Event_Destroy
//   Q sys device stats                      System_GetDeviceInfo, _GetStats
// A handle operand (sys, buf, dst, src, ev) picks by its value mod 8: 0-4 a
// live handle of the kind, 5 any handle of the kind ever returned, 6 one
// of another kind, 7 zero or a made-up id; the value / 8 says which one.
// WAIT is a count (mod 4; 15 mod 16: a NULL list of 2) then that many
// event operands. HOST is where the host bytes live (mod 4): 0-1 the heap,
// 2 a pinned host buffer (one more operand picks it), 3 NULL. Sizes and
// offsets come from small tables with edge cases (0, the end of the buffer,
// 2^64-1); systems have 1-4 MiB regions and 1-8 MiB devices, optionally a
// TPUSHIM_FAULTS spec and a malformed option. Whatever the program leaves
// is destroyed at its end. fuzz/corpus/capi_sequence_fuzzer/ has examples.
//
// The program keeps a model of every handle, buffer and pending operation,
// and asserts:
//  * every call returns OK or an error with a valid code and a message;
//    exactly INVALID_ARGUMENT when the model says an argument or a handle
//    is bad (stale, freed, foreign, of another kind, made up), a handle
//    error's message starting "Invalid TpuShim_"; otherwise the codes the
//    header documents (RESOURCE_EXHAUSTED with CONTRACTS §3's texts,
//    FAILED_PRECONDITION with the region off), and OK for every valid
//    transfer and for a system with valid options and no faults;
//  * bytes read back equal the bytes written whenever the model knows them
//    (no overlapping operation in flight), a host→device source may be
//    overwritten as soon as an IMMUTABLE_ONLY_DURING_CALL call returns, and
//    such a call's event is ready on return unless it was staged;
//  * a failed dependency fails its dependants with the same status, and a
//    device→host transfer that fails so leaves the destination untouched;
//  * events: ready is monotonic, every status seen for one event (await,
//    callbacks) is the same, statuses are OK, CANCELLED or
//    RESOURCE_EXHAUSTED unless faults are injected;
//  * device memory is never overcommitted, host buffers are aligned and do
//    not overlap, GetStats agrees with the model;
//  * callbacks run exactly once, on return from System_Destroy every
//    operation and callback of the system is done, System_Destroy from a
//    system's own callback thread is refused, and nothing hangs: every wait
//    is bounded (5 s) and an operation not done by then is a failure;
//  * with ASan/LSan: no memory error, and nothing leaks once every system
//    is destroyed.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "driver/c_api_internal.h"
#include "env/os.h"
#include "fuzz/fuzz_check.h"
#include "logging/log.h"
#include "tpushim/c_api.h"

namespace tpushim {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kHuge = ~uint64_t{0};
constexpr int kMaxOps = 64;
constexpr size_t kMaxLiveSystems = 2;
// Longer than any operation of these small systems takes; shorter than
// libFuzzer's -timeout, so that a hang is reported with what hung.
constexpr absl::Duration kHangBound = absl::Seconds(5);
// The largest host range the program allocates; larger sizes are all
// outside every device buffer, and must be rejected without a touch.
constexpr uint64_t kMaxHostBytes = kMiB;
constexpr uint8_t kPoison = 0xA5;

const TpuShim_Api* api = nullptr;

// ---- Input ------------------------------------------------------------------

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return next_ == size_; }
  // The next byte; 0 once the input is used up.
  uint8_t Byte() { return next_ < size_ ? data_[next_++] : 0; }
  // A choice in [0, n).
  size_t Below(size_t n) { return Byte() % n; }

 private:
  const uint8_t* const data_;
  const size_t size_;
  size_t next_ = 0;
};

// Bytes nobody else would write: xorshift64 from `seed`.
void FillPattern(uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t x = (seed * 0x9E3779B97F4A7C15ull) | 1;
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x >> 56);
  }
}

bool Overlap(uint64_t a, uint64_t a_size, uint64_t b, uint64_t b_size) {
  return a < b + b_size && b < a + a_size;
}

// `offset` and `size` lie within `total` (no wrap-around).
bool InRange(uint64_t offset, uint64_t size, uint64_t total) {
  return offset <= total && size <= total - offset;
}

// ---- Results ----------------------------------------------------------------

struct Result {
  int code = TPUSHIM_CODE_OK;
  std::string message;
  bool ok() const { return code == TPUSHIM_CODE_OK; }
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "code " << r.code << " \"" << r.message << "\"";
}

// Takes an error apart and frees it.
Result Take(TpuShim_Error* error) {
  Result r;
  r.code = api->Error_Code(error);
  r.message = api->Error_Message(error);
  api->Error_Destroy(error);
  if (error == nullptr) {
    TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_OK && r.message.empty()) << r;
  } else {
    TPUSHIM_FUZZ_CHECK(r.code > TPUSHIM_CODE_OK &&
                       r.code <= TPUSHIM_CODE_UNAUTHENTICATED)
        << r;
    TPUSHIM_FUZZ_CHECK(!r.message.empty()) << r;
  }
  return r;
}

// What the model says about a call's arguments.
struct Verdict {
  bool bad_handle = false;    // stale, freed, foreign, wrong kind, made up
  bool bad_argument = false;  // NULL, size 0, out of range, unknown value
  bool invalid() const { return bad_handle || bad_argument; }
};

// A call the model says is invalid fails with INVALID_ARGUMENT, and one
// with only a bad handle says which kind.
void CheckRejected(absl::string_view call, const Result& r,
                   const Verdict& verdict) {
  TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_INVALID_ARGUMENT)
      << call << ": " << r;
  if (!verdict.bad_argument) {
    TPUSHIM_FUZZ_CHECK(absl::StartsWith(r.message, "Invalid TpuShim_"))
        << call << ": " << r;
  }
}

// The statuses an operation's event may have: its own failures (a pin
// refused for the memlock limit; cancelled by System_Destroy) or, with
// TPUSHIM_FAULTS, any.
bool AllowedEventCode(int code, bool faults) {
  return faults || code == TPUSHIM_CODE_OK || code == TPUSHIM_CODE_CANCELLED ||
         code == TPUSHIM_CODE_RESOURCE_EXHAUSTED;
}

// ---- The model --------------------------------------------------------------

enum class Kind { kSystem, kHostBuffer, kDeviceBuffer, kEvent };
constexpr int kKindCount = 4;

struct Handle {
  Kind kind = Kind::kSystem;
  uint64_t system = 0;  // the system it belongs to (its own id for one)
  bool live = true;
};

struct SystemModel {
  int devices = 0;
  uint64_t hbm = 0;        // per device
  uint64_t region = 0;     // 0: off
  uint64_t threshold = 0;  // 0 with the region off
  bool faults = false;     // a TPUSHIM_FAULTS spec is in force
  uint64_t last_callbacks_run = 0;
};

struct Operation;

struct HostBufferModel {
  uint64_t system = 0;
  uint8_t* data = nullptr;
  uint64_t size = 0;
  // Operations in flight that read or write this memory.
  std::vector<Operation*> users;
};

// What the program knows of a device buffer's bytes.
struct DeviceBufferModel {
  uint64_t system = 0;
  int device = 0;
  uint64_t size = 0;
  std::vector<uint8_t> bytes;
  std::vector<bool> known;
  // Operations in flight that write or read it.
  std::vector<Operation*> writers;
  std::vector<Operation*> readers;
};

enum class OpKind { kToDevice, kFromDevice, kDeviceToDevice, kDeallocate };

// One call that returned an event, tracked by a callback of the program's
// own (so the event handle may be destroyed).
struct Operation {
  OpKind kind = OpKind::kToDevice;
  uint64_t system = 0;
  uint64_t event = 0;
  std::vector<Operation*> deps;  // its wait_for list

  // Set by the tracking callback, before `done` is notified.
  Result status;
  Notification done;

  // Statuses the program has seen through Event_Await*.
  std::optional<Result> observed;
  bool seen_ready = false;
  // Its system was destroyed before it was seen done: its status may be
  // CANCELLED whatever its dependencies did.
  bool cut_short = false;
  bool reaped = false;

  // Device bytes: the buffer written (to device, device to device) and the
  // one read (from device, device to device), with their ranges.
  uint64_t write_buffer = 0, write_offset = 0;
  uint64_t read_buffer = 0, read_offset = 0;
  uint64_t size = 0;
  // The bytes written (to device), or those the read range held when it
  // was submitted, when `data_known`.
  std::vector<uint8_t> data;
  bool data_known = false;
  // Another operation on an overlapping range was in flight at the same
  // time: the bytes are not known.
  bool conflicted = false;

  // Host memory, when it is the heap's.
  std::unique_ptr<uint8_t[]> heap;
  // Where a device→host transfer's bytes land (the heap's or a pinned host
  // buffer's).
  uint8_t* host = nullptr;
  uint64_t host_buffer = 0;  // the pinned host buffer used; 0: the heap
  bool host_gone = false;    // the pinned host buffer's system was destroyed
};

// A callback the program added through Event_AddCallback.
struct CallbackRecord {
  enum class Behavior { kCount, kCheckReady, kDestroyOwnSystem };
  Behavior behavior = Behavior::kCount;
  uint64_t event = 0;
  uint64_t system = 0;
  std::thread::id program_thread;
  bool added = false;  // Event_AddCallback returned OK
  // The operation of the event; null for an invalid handle.
  const Operation* operation = nullptr;
  std::atomic<int> runs{0};
  Mutex mu;
  Result status ABSL_GUARDED_BY(mu);
};

void TrackingCallback(TpuShim_Error* error, void* arg) {
  auto* op = static_cast<Operation*>(arg);
  op->status = Take(error);
  op->done.Notify();
}

void ProgramCallback(TpuShim_Error* error, void* arg) {
  auto* record = static_cast<CallbackRecord*>(arg);
  {
    MutexLock lock(&record->mu);
    record->status = Take(error);
  }
  switch (record->behavior) {
    case CallbackRecord::Behavior::kCount:
      break;
    case CallbackRecord::Behavior::kCheckReady: {
      // A callback runs once its event is ready; the handle may be gone.
      TpuShim_Event_IsReady_Args args = {};
      args.struct_size = TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE;
      args.event.id = record->event;
      const Result r = Take(api->Event_IsReady(&args));
      TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_INVALID_ARGUMENT ||
                         (r.ok() && args.is_ready))
          << "Event_IsReady in its callback: " << r;
      break;
    }
    case CallbackRecord::Behavior::kDestroyOwnSystem:
      // Not on the program's thread (where System_Destroy or an inline
      // callback runs it, and destroying would be legitimate).
      if (std::this_thread::get_id() != record->program_thread) {
        TpuShim_System_Destroy_Args args = {};
        args.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
        args.system.id = record->system;
        const Result r = Take(api->System_Destroy(&args));
        TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_FAILED_PRECONDITION ||
                           r.code == TPUSHIM_CODE_INVALID_ARGUMENT)
            << "System_Destroy from its own callback: " << r;
      }
      break;
  }
  record->runs.fetch_add(1, std::memory_order_acq_rel);
}

// ---- The program ------------------------------------------------------------

class Program {
 public:
  explicit Program(ByteReader input) : in_(input) {}
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  void Run() {
    for (int n = 0; n < kMaxOps && !in_.empty(); ++n) {
      ReapDone();
      Step();
    }
    Finish();
  }

 private:
  // ---- Handles ----

  void AddHandle(uint64_t id, Kind kind, uint64_t system) {
    TPUSHIM_FUZZ_CHECK(id != 0 && handles_.count(id) == 0)
        << "handle 0x" << std::hex << id << " returned twice";
    handles_[id] = Handle{kind, system, true};
    issued_[static_cast<int>(kind)].push_back(id);
  }

  bool IsLive(uint64_t id, Kind kind) const {
    const auto it = handles_.find(id);
    return it != handles_.end() && it->second.live && it->second.kind == kind;
  }

  bool IsLiveIn(uint64_t id, Kind kind, uint64_t system) const {
    return IsLive(id, kind) && handles_.at(id).system == system;
  }

  std::vector<uint64_t> Live(Kind kind) const {
    std::vector<uint64_t> live;
    for (uint64_t id : issued_[static_cast<int>(kind)]) {
      if (handles_.at(id).live) live.push_back(id);
    }
    return live;
  }

  // A handle operand (see the file comment).
  uint64_t PickHandle(Kind kind) {
    const uint8_t b = in_.Byte();
    const size_t which = b / 8;
    const std::vector<uint64_t>& ever = issued_[static_cast<int>(kind)];
    switch (b % 8) {
      case 5:
        if (!ever.empty()) return ever[which % ever.size()];
        break;
      case 6: {
        std::vector<uint64_t> others;
        for (int k = 0; k < kKindCount; ++k) {
          if (k == static_cast<int>(kind)) continue;
          others.insert(others.end(), issued_[k].begin(), issued_[k].end());
        }
        if (!others.empty()) return others[which % others.size()];
        break;
      }
      case 7:
        break;
      default: {
        const std::vector<uint64_t> live = Live(kind);
        if (!live.empty()) return live[which % live.size()];
        break;
      }
    }
    // Zero, or near an id the library gave out (the next generation of its
    // slot, the next slot), or all ones. The model tells whether it is
    // live: only ids it was given can be.
    const uint64_t base = ever.empty() ? 0 : ever[which % ever.size()];
    switch (which % 4) {
      case 0:
        return 0;
      case 1:
        return base + 1;
      case 2:
        return base + (uint64_t{1} << 32);
      default:
        return kHuge;
    }
  }

  // The wait_for list of a call on `system`: the events, and whether the
  // list is valid; `deps` gets the operations of its (valid) events.
  struct WaitList {
    std::vector<TpuShim_Event> events;
    bool null_pointer = false;
    bool bad_handle = false;
    std::vector<Operation*> deps;

    const TpuShim_Event* data() const {
      return null_pointer ? nullptr : events.data();
    }
  };

  WaitList PickWaitList(uint64_t system) {
    const uint8_t b = in_.Byte();
    WaitList list;
    if (b % 16 == 15) {
      list.null_pointer = true;
      list.events.resize(2);
      return list;
    }
    for (size_t i = 0; i < b % 4; ++i) {
      const uint64_t id = PickHandle(Kind::kEvent);
      list.events.push_back(TpuShim_Event{id});
      if (IsLiveIn(id, Kind::kEvent, system)) {
        list.deps.push_back(by_event_.at(id));
      } else {
        list.bad_handle = true;
      }
    }
    return list;
  }

  SystemModel* LiveSystem(uint64_t id) {
    return IsLive(id, Kind::kSystem) ? &systems_.at(id) : nullptr;
  }

  // ---- Operations in flight ----

  // Waits (bounded) until `op`'s callback has run.
  static void WaitDone(const Operation& op) {
    TPUSHIM_FUZZ_CHECK(op.done.WaitForNotificationWithTimeout(kHangBound))
        << "hang: the operation of event 0x" << std::hex << op.event
        << " is not done after " << kHangBound;
  }

  void Settle(Operation* op) {
    if (op->reaped) return;
    WaitDone(*op);
    Reap(*op);
  }

  // Settles everything using a pinned host buffer's memory.
  void SettleHostBuffer(uint64_t id) {
    const std::vector<Operation*> users = host_buffers_.at(id).users;
    for (Operation* op : users) Settle(op);
  }

  void ReapDone() {
    for (const auto& op : operations_) {
      if (!op->reaped && op->done.HasBeenNotified()) Reap(*op);
    }
  }

  static void Remove(std::vector<Operation*>& list, const Operation* op) {
    list.erase(std::remove(list.begin(), list.end(), op), list.end());
  }

  // Takes a finished operation out of flight, checks its status and the
  // bytes it moved, and records what it wrote.
  void Reap(Operation& op) {
    op.reaped = true;
    const SystemModel& system = systems_.at(op.system);
    TPUSHIM_FUZZ_CHECK(AllowedEventCode(op.status.code, system.faults))
        << "event 0x" << std::hex << op.event << ": " << op.status;
    if (op.observed) {
      TPUSHIM_FUZZ_CHECK(op.observed->code == op.status.code &&
                         op.observed->message == op.status.message)
          << "awaited " << *op.observed << ", callback got " << op.status;
    }
    if (op.host_buffer != 0) {
      if (auto it = host_buffers_.find(op.host_buffer);
          it != host_buffers_.end()) {
        Remove(it->second.users, &op);
      }
    }
    DeviceBufferModel* written = FindDeviceBuffer(op.write_buffer);
    DeviceBufferModel* read = FindDeviceBuffer(op.read_buffer);
    if (written != nullptr) Remove(written->writers, &op);
    if (read != nullptr) Remove(read->readers, &op);

    const bool failed_by_dependency = CheckDependencies(op);
    switch (op.kind) {
      case OpKind::kToDevice:
      case OpKind::kDeviceToDevice:
        if (op.status.ok() && op.data_known && !op.conflicted &&
            written != nullptr) {
          std::copy(op.data.begin(), op.data.end(),
                    written->bytes.begin() + op.write_offset);
          std::fill_n(written->known.begin() + op.write_offset, op.size, true);
        }
        break;
      case OpKind::kFromDevice:
        if (op.host_gone) break;
        if (op.status.ok() && op.data_known && !op.conflicted) {
          TPUSHIM_FUZZ_CHECK(std::memcmp(op.host, op.data.data(), op.size) == 0)
              << "device->host of " << op.size << " bytes at offset "
              << op.read_offset << " read back other bytes than were written";
        }
        if (failed_by_dependency) {
          TPUSHIM_FUZZ_CHECK(
              std::all_of(op.host, op.host + op.size,
                          [](uint8_t b) { return b == kPoison; }))
              << "a device->host transfer failed by its dependency wrote to "
                 "its destination";
        }
        break;
      case OpKind::kDeallocate:
        break;
    }
  }

  // A failed dependency fails its dependant with the same status. Returns
  // whether `op` failed that way.
  bool CheckDependencies(const Operation& op) {
    if (op.cut_short) return false;
    bool any_failed = false;
    bool same_status = false;
    for (Operation* dep : op.deps) {
      // Ready before `op` (it waited for them): their callbacks run soon.
      WaitDone(*dep);
      if (dep->status.ok() || dep->cut_short) continue;
      any_failed = true;
      same_status |= dep->status.code == op.status.code &&
                     dep->status.message == op.status.message;
    }
    if (any_failed) {
      TPUSHIM_FUZZ_CHECK(same_status)
          << "event 0x" << std::hex << op.event
          << " has a failed dependency but its own status: " << op.status;
    }
    return any_failed;
  }

  DeviceBufferModel* FindDeviceBuffer(uint64_t id) {
    const auto it = device_buffers_.find(id);
    return it == device_buffers_.end() ? nullptr : &it->second;
  }

  // Records `op` as writing [offset, +size) of buffer `id`: the range is
  // unknown from now on, and every operation in flight on it is in
  // conflict with this one.
  void StartWrite(Operation* op, uint64_t id, uint64_t offset) {
    DeviceBufferModel& b = device_buffers_.at(id);
    op->write_buffer = id;
    op->write_offset = offset;
    for (Operation* other : b.writers) {
      if (Overlap(other->write_offset, other->size, offset, op->size)) {
        other->conflicted = op->conflicted = true;
      }
    }
    for (Operation* other : b.readers) {
      if (Overlap(other->read_offset, other->size, offset, op->size)) {
        other->conflicted = op->conflicted = true;
      }
    }
    std::fill_n(b.known.begin() + offset, op->size, false);
    b.writers.push_back(op);
  }

  // Records `op` as reading [offset, +size) of buffer `id`, with the bytes
  // it must get when the model knows them.
  void StartRead(Operation* op, uint64_t id, uint64_t offset) {
    DeviceBufferModel& b = device_buffers_.at(id);
    op->read_buffer = id;
    op->read_offset = offset;
    op->data_known = std::all_of(b.known.begin() + offset,
                                 b.known.begin() + offset + op->size,
                                 [](bool k) { return k; });
    for (Operation* other : b.writers) {
      if (Overlap(other->write_offset, other->size, offset, op->size)) {
        op->data_known = false;
      }
    }
    if (op->data_known) {
      op->data.assign(b.bytes.begin() + offset,
                      b.bytes.begin() + offset + op->size);
    }
    b.readers.push_back(op);
  }

  // Adds the operation an OK call returned `event` for.
  Operation* Track(std::unique_ptr<Operation> owned, uint64_t event) {
    Operation* op = owned.get();
    op->event = event;
    operations_.push_back(std::move(owned));
    AddHandle(event, Kind::kEvent, op->system);
    by_event_[event] = op;
    TpuShim_Event_AddCallback_Args args = {};
    args.struct_size = TPUSHIM_EVENT_ADDCALLBACK_ARGS_STRUCT_SIZE;
    args.event.id = event;
    args.callback = TrackingCallback;
    args.user_arg = op;
    const Result r = Take(api->Event_AddCallback(&args));
    TPUSHIM_FUZZ_CHECK(r.ok()) << "Event_AddCallback on a new event: " << r;
    return op;
  }

  // ---- Operations ----

  void Step() {
    static constexpr char kLetters[] = "SXhfdrUDMIAWCEQ";
    constexpr size_t kOps = sizeof(kLetters) - 1;
    const uint8_t b = in_.Byte();
    const char* letter =
        b == 0 ? nullptr
               : static_cast<const char*>(std::memchr(kLetters, b, kOps));
    switch (letter != nullptr ? static_cast<size_t>(letter - kLetters)
                              : b % kOps) {
      case 0:
        return CreateSystem();
      case 1:
        return DestroySystem(PickHandle(Kind::kSystem));
      case 2:
        return AllocateHost();
      case 3:
        return FreeHost();
      case 4:
        return AllocateDevice();
      case 5:
        return Deallocate();
      case 6:
        return ToDevice();
      case 7:
        return FromDevice();
      case 8:
        return DeviceToDevice();
      case 9:
        return IsReady();
      case 10:
        return Await();
      case 11:
        return AwaitWithTimeout();
      case 12:
        return AddCallback();
      case 13:
        return DestroyEvent();
      default:
        return Query();
    }
  }

  void CreateSystem() {
    static constexpr uint64_t kRegions[] = {0, kMiB, 2 * kMiB, 4 * kMiB};
    static constexpr uint64_t kThresholds[] = {0, 16 * kKiB, 64 * kKiB,
                                               8 * kMiB};
    static constexpr uint64_t kHbm[] = {kMiB, 2 * kMiB, 4 * kMiB, 8 * kMiB};
    static constexpr const char* kLinks[] = {
        "", "&link_gbps=8", "&latency_us=20", "&dma_engines=2"};
    SystemModel model;
    model.region = kRegions[in_.Below(4)];
    const uint64_t threshold = kThresholds[in_.Below(4)];
    const uint8_t devices = in_.Byte();
    model.devices = 1 + devices % 3;
    model.hbm = kHbm[devices / 3 % 4];
    const char* link = kLinks[in_.Below(4)];
    const uint8_t fault = in_.Byte();
    std::string faults;
    if (fault % 16 >= 8) {
      const unsigned p = in_.Byte();
      const std::string specs[] = {
          absl::StrCat("dma:rate=0.25,seed=", p),
          absl::StrCat("dma:nth=", 1 + p % 8, ",code=UNAVAILABLE"),
          absl::StrCat("pin:every=", 1 + p % 3),
          absl::StrCat("alloc:rate=0.3,seed=", p),
          absl::StrCat("alloc:nth=", 1 + p % 4, ",code=INTERNAL"),
          absl::StrCat("mmap:nth=", 1 + p % 3),
          "mlock:nth=1;madvise:every=2",
          "numa:nth=1",
      };
      faults = specs[fault % 8];
    }
    const uint8_t bad = in_.Byte();
    if (systems_alive_ >= kMaxLiveSystems) return;

    model.threshold = model.region == 0 ? 0
                      : threshold == 0  ? model.region
                                        : std::min(threshold, model.region);
    model.faults = !faults.empty();
    const std::string device = absl::StrCat(
        "sim://?devices=", model.devices, "&hbm=", model.hbm / kMiB, "M", link);
    std::vector<std::pair<std::string, const char*>> options;
    const std::string region = absl::StrCat(model.region);
    const std::string threshold_text = absl::StrCat(threshold);
    options.emplace_back("TPU_PREMAPPED_BUFFER_SIZE", region.c_str());
    if (threshold != 0) {
      options.emplace_back("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES",
                           threshold_text.c_str());
    }
    options.emplace_back("TPUSHIM_DEVICE", device.c_str());
    options.emplace_back("TPUSHIM_PREFAULT_THREADS", "1");
    options.emplace_back("TPUSHIM_HUGEPAGES", "off");
    if (!faults.empty()) options.emplace_back("TPUSHIM_FAULTS", faults.c_str());
    // A malformed option, named in the error.
    std::string bad_name;
    if (bad % 8 == 6) {
      bad_name = "TPU_LOG_DIR";
      options.emplace_back(bad_name, nullptr);
    } else if (bad % 8 == 7) {
      static constexpr std::pair<const char*, const char*> kBad[] = {
          {"TPU_PREMAPPED_BUFFER_SIZE", "4097"},
          {"TPUSHIM_DEVICE", "sim://?devices=0"},
          {"TPUSHIM_NO_SUCH_OPTION", "1"},
      };
      const auto& [name, value] = kBad[bad / 8 % 3];
      bad_name = name;
      options.emplace_back(bad_name, value);
    }
    std::vector<TpuShim_Option> c_options;
    for (const auto& [name, value] : options) {
      c_options.push_back(TpuShim_Option{name.c_str(), value});
    }
    TpuShim_System_Create_Args args = {};
    args.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
    args.options = c_options.data();
    args.num_options = c_options.size();
    const Result r = Take(api->System_Create(&args));
    if (!bad_name.empty()) {
      TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_INVALID_ARGUMENT &&
                         absl::StrContains(r.message, bad_name))
          << "System_Create with a bad " << bad_name << ": " << r;
      return;
    }
    if (!model.faults) {
      TPUSHIM_FUZZ_CHECK(r.ok()) << "System_Create " << device << ": " << r;
    }
    if (!r.ok()) return;
    const uint64_t id = args.system.id;
    AddHandle(id, Kind::kSystem, id);
    systems_[id] = model;
    ++systems_alive_;
    CheckDevices(id, model);
  }

  // The devices are the ones the URL asked for.
  void CheckDevices(uint64_t id, const SystemModel& model) {
    TpuShim_System_GetDeviceCount_Args count = {};
    count.struct_size = TPUSHIM_SYSTEM_GETDEVICECOUNT_ARGS_STRUCT_SIZE;
    count.system.id = id;
    const Result r = Take(api->System_GetDeviceCount(&count));
    TPUSHIM_FUZZ_CHECK(r.ok() && count.device_count == model.devices)
        << r << ", " << count.device_count << " devices";
    for (int d = 0; d < model.devices; ++d) {
      TpuShim_System_GetDeviceInfo_Args info = {};
      info.struct_size = TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE;
      info.system.id = id;
      info.device = d;
      const Result i = Take(api->System_GetDeviceInfo(&info));
      TPUSHIM_FUZZ_CHECK(i.ok() && info.hbm_bytes == model.hbm &&
                         info.name != nullptr && info.backend != nullptr)
          << i;
    }
  }

  void DestroySystem(uint64_t id) {
    const bool valid = IsLive(id, Kind::kSystem);
    if (valid) {
      // Other systems' transfers from or to this one's host buffers: their
      // memory goes with it, so they must be done (a caller's duty).
      for (auto& [buffer_id, buffer] : host_buffers_) {
        if (buffer.system != id) continue;
        const std::vector<Operation*> users = buffer.users;
        for (Operation* op : users) {
          if (op->system != id) Settle(op);
        }
      }
      for (const auto& op : operations_) {
        if (op->system == id && !op->done.HasBeenNotified()) {
          op->cut_short = true;
        }
      }
    }
    TpuShim_System_Destroy_Args args = {};
    args.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
    args.system.id = id;
    const Result r = Take(api->System_Destroy(&args));
    if (!valid) return CheckRejected("System_Destroy", r, {.bad_handle = true});
    TPUSHIM_FUZZ_CHECK(r.ok()) << "System_Destroy: " << r;
    --systems_alive_;
    // Every operation and callback of the system has finished.
    for (const auto& op : operations_) {
      if (op->system != id) continue;
      TPUSHIM_FUZZ_CHECK(op->done.HasBeenNotified())
          << "event 0x" << std::hex << op->event
          << " not done when System_Destroy returned";
    }
    for (const auto& record : callbacks_) {
      if (record->added && record->system == id) {
        TPUSHIM_FUZZ_CHECK(record->runs.load() == 1)
            << "a callback ran " << record->runs.load()
            << " times by the end of System_Destroy";
      }
    }
    // Its buffers' handles are stale; its host buffers' memory is gone.
    for (auto& [handle_id, handle] : handles_) {
      if (handle.system == id && handle.kind != Kind::kEvent) {
        handle.live = false;
      }
    }
    for (auto it = host_buffers_.begin(); it != host_buffers_.end();) {
      if (it->second.system != id) {
        ++it;
        continue;
      }
      for (Operation* op : it->second.users) op->host_gone = true;
      it = host_buffers_.erase(it);
    }
    for (auto it = device_buffers_.begin(); it != device_buffers_.end();) {
      it = it->second.system == id ? device_buffers_.erase(it) : std::next(it);
    }
    ReapDone();
  }

  void AllocateHost() {
    static constexpr uint64_t kSizes[] = {
        0, 1, 64, 1000, 4 * kKiB, 64 * kKiB + 3, 512 * kKiB, 8 * kMiB};
    static constexpr size_t kAlignments[] = {0, 1, 2, 64, 4096, 8192, 3, 48};
    const uint64_t system_id = PickHandle(Kind::kSystem);
    const uint64_t size = kSizes[in_.Below(8)];
    const size_t alignment = kAlignments[in_.Below(8)];
    TpuShim_HostBuffer_Allocate_Args args = {};
    args.struct_size = TPUSHIM_HOSTBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
    args.system.id = system_id;
    args.size = size;
    args.alignment = alignment;
    const Result r = Take(api->HostBuffer_Allocate(&args));
    const SystemModel* system = LiveSystem(system_id);
    if (system == nullptr) {
      return CheckRejected("HostBuffer_Allocate", r, {.bad_handle = true});
    }
    if (system->region == 0) {
      TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_FAILED_PRECONDITION) << r;
      return;
    }
    const bool bad_alignment =
        alignment != 0 &&
        ((alignment & (alignment - 1)) != 0 || alignment > 4096);
    if (size == 0 || bad_alignment) {
      return CheckRejected("HostBuffer_Allocate", r, {.bad_argument = true});
    }
    if (size > system->threshold) {
      TPUSHIM_FUZZ_CHECK(
          r.code == TPUSHIM_CODE_RESOURCE_EXHAUSTED &&
          absl::StrContains(r.message,
                            "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"))
          << r;
      return;
    }
    uint64_t in_use = 0;
    for (const auto& [id, buffer] : host_buffers_) {
      if (buffer.system == system_id) in_use += buffer.size;
    }
    if (!r.ok()) {
      if (system->faults) return;
      TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_RESOURCE_EXHAUSTED &&
                         absl::StrContains(r.message,
                                           "That was not possible. "
                                           "There are "))
          << r;
      return;
    }
    TPUSHIM_FUZZ_CHECK(in_use + size <= system->region)
        << "a region of " << system->region << " bytes gave " << size
        << " more with " << in_use << " in use";
    const uintptr_t address = reinterpret_cast<uintptr_t>(args.data);
    TPUSHIM_FUZZ_CHECK(args.data != nullptr &&
                       address % std::max<size_t>(alignment, 64) == 0)
        << args.data << " for alignment " << alignment;
    for (const auto& [id, buffer] : host_buffers_) {
      if (buffer.system != system_id) continue;
      TPUSHIM_FUZZ_CHECK(!Overlap(
          address, size, reinterpret_cast<uintptr_t>(buffer.data), buffer.size))
          << "two live host buffers overlap";
    }
    // All of it is the caller's.
    std::memset(args.data, 0, size);
    AddHandle(args.buffer.id, Kind::kHostBuffer, system_id);
    host_buffers_[args.buffer.id] =
        HostBufferModel{system_id, static_cast<uint8_t*>(args.data), size, {}};
  }

  void FreeHost() {
    const uint64_t system_id = PickHandle(Kind::kSystem);
    const uint64_t id = PickHandle(Kind::kHostBuffer);
    const Verdict verdict{.bad_handle =
                              !IsLive(system_id, Kind::kSystem) ||
                              !IsLiveIn(id, Kind::kHostBuffer, system_id)};
    // No transfer may still use the memory (HostBuffer_Free's REQUIRES).
    if (!verdict.invalid()) SettleHostBuffer(id);
    TpuShim_HostBuffer_Free_Args args = {};
    args.struct_size = TPUSHIM_HOSTBUFFER_FREE_ARGS_STRUCT_SIZE;
    args.system.id = system_id;
    args.buffer.id = id;
    const Result r = Take(api->HostBuffer_Free(&args));
    if (verdict.invalid()) return CheckRejected("HostBuffer_Free", r, verdict);
    TPUSHIM_FUZZ_CHECK(r.ok()) << "HostBuffer_Free: " << r;
    handles_.at(id).live = false;
    host_buffers_.erase(id);
  }

  void AllocateDevice() {
    static constexpr uint64_t kSizes[] = {
        0, 1, 100, 4 * kKiB, 64 * kKiB + 7, 256 * kKiB, kMiB, kHuge};
    const uint64_t system_id = PickHandle(Kind::kSystem);
    const int device = static_cast<int>(in_.Below(4)) - 1;  // -1 .. 2
    uint64_t size = kSizes[in_.Below(8)];
    const SystemModel* system = LiveSystem(system_id);
    // The last size is one byte more than the device has.
    if (size == kHuge && system != nullptr) size = system->hbm + 1;
    TpuShim_DeviceBuffer_Allocate_Args args = {};
    args.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
    args.system.id = system_id;
    args.device = device;
    args.size = size;
    const Result r = Take(api->DeviceBuffer_Allocate(&args));
    if (system == nullptr) {
      return CheckRejected("DeviceBuffer_Allocate", r, {.bad_handle = true});
    }
    if (device < 0 || device >= system->devices || size == 0) {
      return CheckRejected("DeviceBuffer_Allocate", r, {.bad_argument = true});
    }
    uint64_t in_use = 0;
    for (const auto& [id, buffer] : device_buffers_) {
      if (buffer.system == system_id && buffer.device == device) {
        in_use += buffer.size;
      }
    }
    if (!r.ok()) {
      TPUSHIM_FUZZ_CHECK(
          r.code == TPUSHIM_CODE_RESOURCE_EXHAUSTED &&
          absl::StartsWith(r.message,
                           "Error allocating device buffer: Attempting to "
                           "allocate ") &&
          absl::StrContains(r.message, "That was not possible. There are ") &&
          absl::EndsWith(r.message, "_HBM0)"))
          << r;
      return;
    }
    TPUSHIM_FUZZ_CHECK(in_use + size <= system->hbm)
        << "device memory overcommitted: " << in_use << " + " << size
        << " bytes on a device of " << system->hbm;
    AddHandle(args.buffer.id, Kind::kDeviceBuffer, system_id);
    DeviceBufferModel& model = device_buffers_[args.buffer.id];
    model.system = system_id;
    model.device = device;
    model.size = size;
    model.bytes.resize(size);
    model.known.resize(size, false);
  }

  void Deallocate() {
    const uint64_t system_id = PickHandle(Kind::kSystem);
    const uint64_t id = PickHandle(Kind::kDeviceBuffer);
    const bool system_ok = IsLive(system_id, Kind::kSystem);
    const WaitList wait = PickWaitList(system_id);
    const Verdict verdict{
        .bad_handle = !system_ok ||
                      !IsLiveIn(id, Kind::kDeviceBuffer, system_id) ||
                      wait.bad_handle,
        .bad_argument = wait.null_pointer};
    TpuShim_DeviceBuffer_Deallocate_Args args = {};
    args.struct_size = TPUSHIM_DEVICEBUFFER_DEALLOCATE_ARGS_STRUCT_SIZE;
    args.system.id = system_id;
    args.buffer.id = id;
    args.wait_for = wait.data();
    args.num_wait_for = wait.events.size();
    const Result r = Take(api->DeviceBuffer_Deallocate(&args));
    if (verdict.invalid()) {
      return CheckRejected("DeviceBuffer_Deallocate", r, verdict);
    }
    TPUSHIM_FUZZ_CHECK(r.ok()) << "DeviceBuffer_Deallocate: " << r;
    handles_.at(id).live = false;
    device_buffers_.erase(id);
    auto op = std::make_unique<Operation>();
    op->kind = OpKind::kDeallocate;
    op->system = system_id;
    op->deps = wait.deps;
    Track(std::move(op), args.event.id);
  }

  // A transfer size, and an offset for it within a buffer of `total`
  // bytes (0 when there is no buffer).
  std::pair<uint64_t, uint64_t> PickRange(uint64_t total) {
    static constexpr uint64_t kSizes[] = {
        0, 1, 13, 4 * kKiB, 16 * kKiB + 5, 64 * kKiB, 256 * kKiB, kHuge};
    const uint8_t offset_choice = in_.Byte();
    const uint64_t size = kSizes[in_.Below(8)];
    return {size, PickOffset(offset_choice, total, size)};
  }

  static uint64_t PickOffset(uint8_t choice, uint64_t total, uint64_t size) {
    switch (choice % 8) {
      case 0:
        return 0;
      case 1:
        return 1;
      case 2:
        return 7;
      case 3:
        return 4 * kKiB;
      case 4:
        return size <= total ? total - size : 0;  // at the end
      case 5:
        return total;
      case 6:
        return total == 0 ? 0 : total - 1;
      default:
        return kHuge;
    }
  }

  // Host memory for a transfer of `size` bytes (see HOST in the file
  // comment): a pinned host buffer's (settled: the operation will be the
  // only one using it), else the heap's; null for the NULL choice.
  uint8_t* PickHost(Operation& op, uint64_t size) {
    const uint8_t where = in_.Byte() % 4;
    if (where == 3) return nullptr;
    if (where == 2) {
      const uint64_t id = PickHandle(Kind::kHostBuffer);
      const auto it = host_buffers_.find(id);
      if (it != host_buffers_.end() && size <= it->second.size) {
        SettleHostBuffer(id);
        op.host_buffer = id;
        it->second.users.push_back(&op);
        // At the buffer's end, so that a range overrun crosses it.
        return it->second.data + (it->second.size - size);
      }
    }
    op.heap = std::make_unique_for_overwrite<uint8_t[]>(
        std::max<uint64_t>(1, std::min(size, kMaxHostBytes)));
    return op.heap.get();
  }

  // The host memory of an operation whose call failed is no one's.
  void Untrack(Operation& op) {
    if (op.host_buffer != 0) {
      Remove(host_buffers_.at(op.host_buffer).users, &op);
    }
  }

  int32_t PickSemantics() {
    static constexpr int32_t kSemantics[] = {
        TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL,
        TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES,
        TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES, 7};
    return kSemantics[in_.Below(4)];
  }

  // IMMUTABLE_ONLY_DURING_CALL: the transfer is over when the call returns
  // unless it was staged host→device.
  void CheckReadyOnReturn(uint64_t event) {
    TpuShim_Event_IsReady_Args args = {};
    args.struct_size = TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE;
    args.event.id = event;
    const Result r = Take(api->Event_IsReady(&args));
    TPUSHIM_FUZZ_CHECK(r.ok() && args.is_ready)
        << "an IMMUTABLE_ONLY_DURING_CALL transfer returned before it was "
           "done: "
        << r;
  }

  void ToDevice() {
    const uint64_t system_id = PickHandle(Kind::kSystem);
    const uint64_t dst = PickHandle(Kind::kDeviceBuffer);
    auto op = std::make_unique<Operation>();
    op->kind = OpKind::kToDevice;
    op->system = system_id;
    DeviceBufferModel* buffer = FindDeviceBuffer(dst);
    const std::pair<uint64_t, uint64_t> range =
        PickRange(buffer != nullptr ? buffer->size : 0);
    op->size = range.first;
    const uint64_t offset = range.second;
    uint8_t* src = PickHost(*op, op->size);
    const int32_t semantics = PickSemantics();
    const WaitList wait = PickWaitList(system_id);
    const SystemModel* system = LiveSystem(system_id);
    const bool dst_ok = IsLiveIn(dst, Kind::kDeviceBuffer, system_id);
    const Verdict verdict{
        .bad_handle = system == nullptr || !dst_ok || wait.bad_handle,
        .bad_argument = src == nullptr || semantics == 7 || wait.null_pointer ||
                        op->size == 0 ||
                        (dst_ok && !InRange(offset, op->size, buffer->size))};
    // A range the program could not back with memory is never valid.
    TPUSHIM_FUZZ_CHECK(verdict.invalid() || op->size <= kMaxHostBytes);
    const uint64_t serial = ++serial_;
    if (src != nullptr) {
      FillPattern(src, std::min(op->size, kMaxHostBytes), serial);
    }
    TpuShim_Transfer_ToDevice_Args args = {};
    args.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
    args.system.id = system_id;
    args.src = src;
    args.dst.id = dst;
    args.dst_offset = offset;
    args.size = op->size;
    args.wait_for = wait.data();
    args.num_wait_for = wait.events.size();
    args.semantics = semantics;
    const Result r = Take(api->Transfer_ToDevice(&args));
    if (verdict.invalid()) {
      Untrack(*op);
      return CheckRejected("Transfer_ToDevice", r, verdict);
    }
    TPUSHIM_FUZZ_CHECK(r.ok()) << "Transfer_ToDevice: " << r;
    op->deps = wait.deps;
    op->data.assign(src, src + op->size);
    op->data_known = true;
    StartWrite(op.get(), dst, offset);
    if (semantics == TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL) {
      // The source may be reused at once: the device must have its bytes.
      std::fill_n(src, op->size, kPoison);
      const bool zero_copy =
          op->host_buffer != 0 &&
          host_buffers_.at(op->host_buffer).system == system_id;
      const bool staged =
          !zero_copy && system->region != 0 && op->size <= system->threshold;
      if (!staged) CheckReadyOnReturn(args.event.id);
    }
    Track(std::move(op), args.event.id);
  }

  void FromDevice() {
    const uint64_t system_id = PickHandle(Kind::kSystem);
    const uint64_t src_id = PickHandle(Kind::kDeviceBuffer);
    auto op = std::make_unique<Operation>();
    op->kind = OpKind::kFromDevice;
    op->system = system_id;
    DeviceBufferModel* buffer = FindDeviceBuffer(src_id);
    const std::pair<uint64_t, uint64_t> range =
        PickRange(buffer != nullptr ? buffer->size : 0);
    op->size = range.first;
    const uint64_t offset = range.second;
    uint8_t* dst = PickHost(*op, op->size);
    const int32_t semantics = PickSemantics();
    const WaitList wait = PickWaitList(system_id);
    const SystemModel* system = LiveSystem(system_id);
    const bool src_ok = IsLiveIn(src_id, Kind::kDeviceBuffer, system_id);
    const Verdict verdict{
        .bad_handle = system == nullptr || !src_ok || wait.bad_handle,
        .bad_argument = dst == nullptr || semantics == 7 || wait.null_pointer ||
                        op->size == 0 ||
                        (src_ok && !InRange(offset, op->size, buffer->size))};
    TPUSHIM_FUZZ_CHECK(verdict.invalid() || op->size <= kMaxHostBytes);
    if (dst != nullptr) {
      std::fill_n(dst, std::min(op->size, kMaxHostBytes), kPoison);
    }
    TpuShim_Transfer_FromDevice_Args args = {};
    args.struct_size = TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE;
    args.system.id = system_id;
    args.src.id = src_id;
    args.src_offset = offset;
    args.dst = dst;
    args.size = op->size;
    args.wait_for = wait.data();
    args.num_wait_for = wait.events.size();
    args.semantics = semantics;
    const Result r = Take(api->Transfer_FromDevice(&args));
    if (verdict.invalid()) {
      Untrack(*op);
      return CheckRejected("Transfer_FromDevice", r, verdict);
    }
    TPUSHIM_FUZZ_CHECK(r.ok()) << "Transfer_FromDevice: " << r;
    op->deps = wait.deps;
    op->host = dst;
    StartRead(op.get(), src_id, offset);
    if (semantics == TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL) {
      CheckReadyOnReturn(args.event.id);
    }
    Track(std::move(op), args.event.id);
  }

  void DeviceToDevice() {
    const uint64_t system_id = PickHandle(Kind::kSystem);
    const uint64_t src_id = PickHandle(Kind::kDeviceBuffer);
    const uint64_t dst_id = PickHandle(Kind::kDeviceBuffer);
    DeviceBufferModel* src = FindDeviceBuffer(src_id);
    DeviceBufferModel* dst = FindDeviceBuffer(dst_id);
    const uint64_t src_size = src != nullptr ? src->size : 0;
    const uint64_t dst_size = dst != nullptr ? dst->size : 0;
    const uint8_t src_choice = in_.Byte();
    const uint8_t dst_choice = in_.Byte();
    static constexpr uint64_t kSizes[] = {
        0, 1, 13, 4 * kKiB, 16 * kKiB + 5, 64 * kKiB, 256 * kKiB, kHuge};
    const uint64_t size = kSizes[in_.Below(8)];
    const uint64_t src_offset = PickOffset(src_choice, src_size, size);
    const uint64_t dst_offset = PickOffset(dst_choice, dst_size, size);
    const WaitList wait = PickWaitList(system_id);
    const bool src_ok = IsLiveIn(src_id, Kind::kDeviceBuffer, system_id);
    const bool dst_ok = IsLiveIn(dst_id, Kind::kDeviceBuffer, system_id);
    const Verdict verdict{
        .bad_handle = !IsLive(system_id, Kind::kSystem) || !src_ok || !dst_ok ||
                      wait.bad_handle,
        .bad_argument = wait.null_pointer || size == 0 ||
                        (src_ok && !InRange(src_offset, size, src_size)) ||
                        (dst_ok && !InRange(dst_offset, size, dst_size))};
    TpuShim_Transfer_DeviceToDevice_Args args = {};
    args.struct_size = TPUSHIM_TRANSFER_DEVICETODEVICE_ARGS_STRUCT_SIZE;
    args.system.id = system_id;
    args.src.id = src_id;
    args.src_offset = src_offset;
    args.dst.id = dst_id;
    args.dst_offset = dst_offset;
    args.size = size;
    args.wait_for = wait.data();
    args.num_wait_for = wait.events.size();
    const Result r = Take(api->Transfer_DeviceToDevice(&args));
    if (verdict.invalid()) {
      return CheckRejected("Transfer_DeviceToDevice", r, verdict);
    }
    TPUSHIM_FUZZ_CHECK(r.ok()) << "Transfer_DeviceToDevice: " << r;
    auto op = std::make_unique<Operation>();
    op->kind = OpKind::kDeviceToDevice;
    op->system = system_id;
    op->size = size;
    op->deps = wait.deps;
    // Read first: a copy onto an overlapping range of the same buffer is
    // then in conflict with itself, and its bytes unknown.
    StartRead(op.get(), src_id, src_offset);
    StartWrite(op.get(), dst_id, dst_offset);
    Track(std::move(op), args.event.id);
  }

  // ---- Events ----

  void IsReady() {
    const uint64_t id = PickHandle(Kind::kEvent);
    const bool valid = IsLive(id, Kind::kEvent);
    Operation* op = valid ? by_event_.at(id) : nullptr;
    const bool done_before = op != nullptr && op->done.HasBeenNotified();
    TpuShim_Event_IsReady_Args args = {};
    args.struct_size = TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE;
    args.event.id = id;
    const Result r = Take(api->Event_IsReady(&args));
    if (!valid) return CheckRejected("Event_IsReady", r, {.bad_handle = true});
    TPUSHIM_FUZZ_CHECK(r.ok()) << "Event_IsReady: " << r;
    CheckReadiness(*op, args.is_ready, done_before);
  }

  // Ready never goes back, and an event whose callbacks ran is ready.
  static void CheckReadiness(Operation& op, bool ready, bool done_before) {
    TPUSHIM_FUZZ_CHECK(ready || (!op.seen_ready && !done_before))
        << "event 0x" << std::hex << op.event << " not ready after "
        << (op.seen_ready ? "it was" : "its callback ran");
    op.seen_ready |= ready;
  }

  // A status seen for the event is the one every other observer sees
  // (Reap compares the callback's with the ones seen before it).
  static void Observe(Operation& op, const Result& status) {
    const Result* before = op.reaped     ? &op.status
                           : op.observed ? &*op.observed
                                         : nullptr;
    if (before != nullptr) {
      TPUSHIM_FUZZ_CHECK(before->code == status.code &&
                         before->message == status.message)
          << "event 0x" << std::hex << op.event << " was " << *before
          << ", now " << status;
    }
    op.observed = status;
  }

  void Await() {
    const uint64_t id = PickHandle(Kind::kEvent);
    const bool valid = IsLive(id, Kind::kEvent);
    // Event_Await has no bound: call it on a ready event only.
    if (valid) WaitDone(*by_event_.at(id));
    TpuShim_Event_Await_Args args = {};
    args.struct_size = TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE;
    args.event.id = id;
    const Result r = Take(api->Event_Await(&args));
    if (!valid) return CheckRejected("Event_Await", r, {.bad_handle = true});
    Observe(*by_event_.at(id), r);
  }

  void AwaitWithTimeout() {
    static constexpr int64_t kTimeoutsNs[] = {-5, 0, 200'000, 2'000'000};
    const uint64_t id = PickHandle(Kind::kEvent);
    const int64_t timeout = kTimeoutsNs[in_.Below(4)];
    const bool valid = IsLive(id, Kind::kEvent);
    Operation* op = valid ? by_event_.at(id) : nullptr;
    const bool done_before = op != nullptr && op->done.HasBeenNotified();
    TpuShim_Event_AwaitWithTimeout_Args args = {};
    args.struct_size = TPUSHIM_EVENT_AWAITWITHTIMEOUT_ARGS_STRUCT_SIZE;
    args.event.id = id;
    args.timeout_ns = timeout;
    const Result r = Take(api->Event_AwaitWithTimeout(&args));
    if (!valid) {
      return CheckRejected("Event_AwaitWithTimeout", r, {.bad_handle = true});
    }
    CheckReadiness(*op, args.ready, done_before);
    if (args.ready) {
      Observe(*op, r);
    } else {
      TPUSHIM_FUZZ_CHECK(r.ok()) << "not ready, yet an error: " << r;
    }
  }

  void AddCallback() {
    const uint64_t id = PickHandle(Kind::kEvent);
    const uint8_t kind = in_.Byte() % 4;
    const bool valid = IsLive(id, Kind::kEvent);
    Operation* op = valid ? by_event_.at(id) : nullptr;
    const bool done_before = op != nullptr && op->done.HasBeenNotified();
    auto record = std::make_unique<CallbackRecord>();
    record->behavior = static_cast<CallbackRecord::Behavior>(kind % 3);
    record->event = id;
    record->system = op != nullptr ? op->system : 0;
    record->program_thread = std::this_thread::get_id();
    TpuShim_Event_AddCallback_Args args = {};
    args.struct_size = TPUSHIM_EVENT_ADDCALLBACK_ARGS_STRUCT_SIZE;
    args.event.id = id;
    args.callback = kind == 3 ? nullptr : ProgramCallback;
    args.user_arg = record.get();
    const Result r = Take(api->Event_AddCallback(&args));
    const Verdict verdict{.bad_handle = !valid, .bad_argument = kind == 3};
    if (verdict.invalid()) {
      CheckRejected("Event_AddCallback", r, verdict);
    } else {
      TPUSHIM_FUZZ_CHECK(r.ok()) << "Event_AddCallback: " << r;
      record->added = true;
      // On a ready event it runs before Event_AddCallback returns.
      if (done_before) {
        TPUSHIM_FUZZ_CHECK(record->runs.load() == 1)
            << "a callback added to a ready event did not run at once";
      }
    }
    record->operation = op;
    callbacks_.push_back(std::move(record));
  }

  void DestroyEvent() {
    const uint64_t id = PickHandle(Kind::kEvent);
    const bool valid = IsLive(id, Kind::kEvent);
    TpuShim_Event_Destroy_Args args = {};
    args.struct_size = TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE;
    args.event.id = id;
    const Result r = Take(api->Event_Destroy(&args));
    if (!valid) return CheckRejected("Event_Destroy", r, {.bad_handle = true});
    TPUSHIM_FUZZ_CHECK(r.ok()) << "Event_Destroy: " << r;
    handles_.at(id).live = false;
  }

  // ---- Queries ----

  void Query() {
    const uint64_t system_id = PickHandle(Kind::kSystem);
    const int device = static_cast<int>(in_.Below(4)) - 1;  // -1 .. 2
    const uint8_t stats_choice = in_.Byte() % 4;
    SystemModel* system = LiveSystem(system_id);

    TpuShim_System_GetDeviceInfo_Args info = {};
    info.struct_size = TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE;
    info.system.id = system_id;
    info.device = device;
    const Result i = Take(api->System_GetDeviceInfo(&info));
    if (system == nullptr) {
      CheckRejected("System_GetDeviceInfo", i, {.bad_handle = true});
    } else if (device < 0 || device >= system->devices) {
      CheckRejected("System_GetDeviceInfo", i, {.bad_argument = true});
    } else {
      TPUSHIM_FUZZ_CHECK(i.ok() && info.hbm_bytes == system->hbm) << i;
    }

    TpuShim_Stats stats = {};
    // The last choice is a stats struct older than API 1.0 allows.
    stats.struct_size = TPUSHIM_STATS_STRUCT_SIZE - (stats_choice == 3 ? 1 : 0);
    TpuShim_System_GetStats_Args args = {};
    args.struct_size = TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE;
    args.system.id = system_id;
    args.stats = &stats;
    const Result r = Take(api->System_GetStats(&args));
    const Verdict verdict{.bad_handle = system == nullptr,
                          .bad_argument = stats_choice == 3};
    if (verdict.invalid()) return CheckRejected("System_GetStats", r, verdict);
    TPUSHIM_FUZZ_CHECK(r.ok()) << "System_GetStats: " << r;
    CheckStats(system_id, *system, stats);
  }

  void CheckStats(uint64_t id, SystemModel& system, const TpuShim_Stats& s) {
    TPUSHIM_FUZZ_CHECK(s.region_enabled == (system.region != 0 ? 1 : 0));
    if (system.region != 0) {
      TPUSHIM_FUZZ_CHECK(s.region_capacity_bytes == system.region &&
                         s.region_threshold_bytes == system.threshold)
          << s.region_capacity_bytes << " " << s.region_threshold_bytes;
    }
    TPUSHIM_FUZZ_CHECK(s.region_bytes_in_use <= s.region_capacity_bytes &&
                       s.region_free_bytes <= s.region_capacity_bytes &&
                       s.region_largest_free_block <= s.region_free_bytes &&
                       s.region_peak_bytes_in_use >= s.region_bytes_in_use);
    uint64_t host_buffers = 0, host_bytes = 0;
    for (const auto& [buffer_id, buffer] : host_buffers_) {
      if (buffer.system != id) continue;
      ++host_buffers;
      host_bytes += buffer.size;
    }
    TPUSHIM_FUZZ_CHECK(s.region_live_allocations >= host_buffers &&
                       s.region_bytes_in_use >= host_bytes)
        << s.region_live_allocations << " allocations of "
        << s.region_bytes_in_use << " bytes for " << host_buffers
        << " host buffers of " << host_bytes;
    uint64_t device_buffers = 0, device_bytes = 0;
    for (const auto& [buffer_id, buffer] : device_buffers_) {
      if (buffer.system != id) continue;
      ++device_buffers;
      device_bytes += buffer.size;
    }
    TPUSHIM_FUZZ_CHECK(s.device_buffers_live >= device_buffers &&
                       s.device_bytes_live >= device_bytes)
        << s.device_buffers_live << " device buffers of " << s.device_bytes_live
        << " bytes for " << device_buffers << " of " << device_bytes;
    TPUSHIM_FUZZ_CHECK(s.callbacks_run >= system.last_callbacks_run);
    system.last_callbacks_run = s.callbacks_run;
  }

  // ---- The end ----

  // Destroys what is left and checks every callback ran once.
  void Finish() {
    for (uint64_t id : Live(Kind::kSystem)) DestroySystem(id);
    for (const auto& op : operations_) {
      TPUSHIM_FUZZ_CHECK(op->reaped);
    }
    for (uint64_t id : Live(Kind::kEvent)) {
      TpuShim_Event_Destroy_Args args = {};
      args.struct_size = TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE;
      args.event.id = id;
      const Result r = Take(api->Event_Destroy(&args));
      TPUSHIM_FUZZ_CHECK(r.ok()) << "Event_Destroy: " << r;
    }
    for (const auto& record : callbacks_) {
      const int runs = record->runs.load();
      TPUSHIM_FUZZ_CHECK(runs == (record->added ? 1 : 0))
          << "a callback ran " << runs << " times";
      if (!record->added || record->operation == nullptr) continue;
      MutexLock lock(&record->mu);
      TPUSHIM_FUZZ_CHECK(
          record->status.code == record->operation->status.code &&
          record->status.message == record->operation->status.message)
          << "a callback got " << record->status << ", the event was "
          << record->operation->status;
    }
  }

  ByteReader in_;
  uint64_t serial_ = 0;  // seeds each transfer's bytes

  std::map<uint64_t, Handle> handles_;
  std::array<std::vector<uint64_t>, kKindCount> issued_;
  std::map<uint64_t, SystemModel> systems_;
  size_t systems_alive_ = 0;
  std::map<uint64_t, HostBufferModel> host_buffers_;
  std::map<uint64_t, DeviceBufferModel> device_buffers_;
  std::vector<std::unique_ptr<Operation>> operations_;
  std::map<uint64_t, Operation*> by_event_;
  std::vector<std::unique_ptr<CallbackRecord>> callbacks_;
};

}  // namespace
}  // namespace tpushim

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  using tpushim::Os;
  // Systems see no environment: only the program's options count.
  static tpushim::FixedEnvironmentOs* const os =
      new tpushim::FixedEnvironmentOs(Os::Default());
  tpushim::capi_internal::SetOsForTesting(os);
  // Logging is process-wide and set up by the first System_Create unless
  // it already is: set it up here, with no files and nothing on stderr
  // below FATAL, so no system's options change it. Every message is still
  // formatted and queued.
  tpushim::logging::LogConfig config;
  config.log_dir = "";
  config.stderr_level = tpushim::logging::Severity::kFatal;
  const absl::Status status = tpushim::logging::InitLogging(config, os);
  TPUSHIM_FUZZ_CHECK(status.ok()) << status;
  tpushim::api = TpuShim_GetApi();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpushim::Program program(tpushim::ByteReader(data, size));
  program.Run();
  return 0;
}
