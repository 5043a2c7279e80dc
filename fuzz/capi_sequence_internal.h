// The inside of the C ABI sequence fuzzer (capi_sequence_fuzzer.cc says
// what an input is and what the target asserts): the input reader, call
// results, the model the program keeps of handles, buffers and operations,
// and the Program that runs one input, whose methods are defined by job:
//
//   capi_sequence_fuzzer.cc     the entry points; the program's loop (Run,
//                               Step, Finish)
//   capi_sequence_model.cc      call results; handles; operations in flight
//   capi_sequence_systems.cc    systems, host and device buffers, queries
//   capi_sequence_transfers.cc  transfers in every direction
//   capi_sequence_events.cc     events: readiness, awaits, callbacks
//
// Thread-safety: a Program and its model belong to the thread that runs the
// input. The library's threads touch only what its callbacks are given: an
// Operation's `status` (set before `done` is notified) and a
// CallbackRecord, whose members say how they are guarded.

#ifndef TPUSHIM_FUZZ_CAPI_SEQUENCE_INTERNAL_H_
#define TPUSHIM_FUZZ_CAPI_SEQUENCE_INTERNAL_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "tpushim/c_api.h"

namespace tpushim::fuzz::capi_sequence_internal {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kHuge = ~uint64_t{0};
inline constexpr uint8_t kPoison = 0xA5;

// The C API, as TpuShim_GetApi gives it (set by LLVMFuzzerInitialize).
extern const TpuShim_Api* api;

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

inline bool Overlap(uint64_t a, uint64_t a_size, uint64_t b, uint64_t b_size) {
  return a < b + b_size && b < a + a_size;
}

// ---- Results ----------------------------------------------------------------

struct Result {
  int code = TPUSHIM_CODE_OK;
  std::string message;
  bool ok() const { return code == TPUSHIM_CODE_OK; }
};

std::ostream& operator<<(std::ostream& os, const Result& r);

// Takes an error apart and frees it.
Result Take(TpuShim_Error* error);

// What the model says about a call's arguments.
struct Verdict {
  bool bad_handle = false;    // stale, freed, foreign, wrong kind, made up
  bool bad_argument = false;  // NULL, size 0, out of range, unknown value
  bool invalid() const { return bad_handle || bad_argument; }
};

// A call the model says is invalid fails with INVALID_ARGUMENT, and one
// with only a bad handle says which kind.
void CheckRejected(absl::string_view call, const Result& r,
                   const Verdict& verdict);

// ---- The model --------------------------------------------------------------

enum class Kind { kSystem, kHostBuffer, kDeviceBuffer, kEvent };
inline constexpr int kKindCount = 4;

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
  // Which chips of the simulated host it owns: a System owns its chips,
  // so two live Systems of the program use different ones.
  int chip_slot = 0;
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

// ---- The program ------------------------------------------------------------

class Program {
 public:
  explicit Program(ByteReader input) : in_(input) {}
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  void Run();

 private:
  // ---- Handles (capi_sequence_model.cc) ----

  void AddHandle(uint64_t id, Kind kind, uint64_t system);
  bool IsLive(uint64_t id, Kind kind) const;
  bool IsLiveIn(uint64_t id, Kind kind, uint64_t system) const;
  std::vector<uint64_t> Live(Kind kind) const;
  uint64_t PickHandle(Kind kind);

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

  WaitList PickWaitList(uint64_t system);
  SystemModel* LiveSystem(uint64_t id);

  // ---- Operations in flight (capi_sequence_model.cc) ----

  static void WaitDone(const Operation& op);
  void Settle(Operation* op);
  void SettleHostBuffer(uint64_t id);
  void ReapDone();
  static void Remove(std::vector<Operation*>& list, const Operation* op);
  void Reap(Operation& op);
  bool CheckDependencies(const Operation& op);
  DeviceBufferModel* FindDeviceBuffer(uint64_t id);
  void StartWrite(Operation* op, uint64_t id, uint64_t offset);
  void StartRead(Operation* op, uint64_t id, uint64_t offset);
  Operation* Track(std::unique_ptr<Operation> owned, uint64_t event);

  // ---- Operations ----

  // capi_sequence_fuzzer.cc
  void Step();
  // capi_sequence_systems.cc
  void CreateSystem();
  void CheckDevices(uint64_t id, const SystemModel& model);
  void DestroySystem(uint64_t id);
  void AllocateHost();
  void FreeHost();
  void AllocateDevice();
  void Deallocate();
  // capi_sequence_transfers.cc
  std::pair<uint64_t, uint64_t> PickRange(uint64_t total);
  static uint64_t PickOffset(uint8_t choice, uint64_t total, uint64_t size);
  uint8_t* PickHost(Operation& op, uint64_t size);
  void Untrack(Operation& op);
  int32_t PickSemantics();
  void CheckReadyOnReturn(uint64_t event);
  void ToDevice();
  void FromDevice();
  void DeviceToDevice();

  // ---- Events (capi_sequence_events.cc) ----

  void IsReady();
  static void CheckReadiness(Operation& op, bool ready, bool done_before);
  static void Observe(Operation& op, const Result& status);
  void Await();
  void AwaitWithTimeout();
  void AddCallback();
  void DestroyEvent();

  // ---- Queries (capi_sequence_systems.cc) ----

  void Query();
  void CheckStats(uint64_t id, SystemModel& system, const TpuShim_Stats& s);

  // ---- The end (capi_sequence_fuzzer.cc) ----

  void Finish();

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

}  // namespace tpushim::fuzz::capi_sequence_internal

#endif  // TPUSHIM_FUZZ_CAPI_SEQUENCE_INTERNAL_H_
