#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "fuzz/capi_sequence_internal.h"
#include "fuzz/fuzz_check.h"

namespace tpushim::fuzz::capi_sequence_internal {
namespace {

// Longer than any operation of these small systems takes; shorter than
// libFuzzer's -timeout, so that a hang is reported with what hung.
constexpr absl::Duration kHangBound = absl::Seconds(5);

// The statuses an operation's event may have: its own failures (a pin
// refused for the memlock limit; cancelled by System_Destroy) or, with
// TPUSHIM_FAULTS, any.
bool AllowedEventCode(int code, bool faults) {
  return faults || code == TPUSHIM_CODE_OK || code == TPUSHIM_CODE_CANCELLED ||
         code == TPUSHIM_CODE_RESOURCE_EXHAUSTED;
}

void TrackingCallback(TpuShim_Error* error, void* arg) {
  auto* op = static_cast<Operation*>(arg);
  op->status = Take(error);
  op->done.Notify();
}

}  // namespace

// ---- Results ----------------------------------------------------------------

std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "code " << r.code << " \"" << r.message << "\"";
}

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

void CheckRejected(absl::string_view call, const Result& r,
                   const Verdict& verdict) {
  TPUSHIM_FUZZ_CHECK(r.code == TPUSHIM_CODE_INVALID_ARGUMENT)
      << call << ": " << r;
  if (!verdict.bad_argument) {
    TPUSHIM_FUZZ_CHECK(absl::StartsWith(r.message, "Invalid TpuShim_"))
        << call << ": " << r;
  }
}

// ---- Handles ----

void Program::AddHandle(uint64_t id, Kind kind, uint64_t system) {
  TPUSHIM_FUZZ_CHECK(id != 0 && handles_.count(id) == 0)
      << "handle 0x" << std::hex << id << " returned twice";
  handles_[id] = Handle{kind, system, true};
  issued_[static_cast<int>(kind)].push_back(id);
}

bool Program::IsLive(uint64_t id, Kind kind) const {
  const auto it = handles_.find(id);
  return it != handles_.end() && it->second.live && it->second.kind == kind;
}

bool Program::IsLiveIn(uint64_t id, Kind kind, uint64_t system) const {
  return IsLive(id, kind) && handles_.at(id).system == system;
}

std::vector<uint64_t> Program::Live(Kind kind) const {
  std::vector<uint64_t> live;
  for (uint64_t id : issued_[static_cast<int>(kind)]) {
    if (handles_.at(id).live) live.push_back(id);
  }
  return live;
}

// A handle operand (see the file comment).
uint64_t Program::PickHandle(Kind kind) {
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

Program::WaitList Program::PickWaitList(uint64_t system) {
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

SystemModel* Program::LiveSystem(uint64_t id) {
  return IsLive(id, Kind::kSystem) ? &systems_.at(id) : nullptr;
}

// ---- Operations in flight ----

// Waits (bounded) until `op`'s callback has run.
void Program::WaitDone(const Operation& op) {
  TPUSHIM_FUZZ_CHECK(op.done.WaitForNotificationWithTimeout(kHangBound))
      << "hang: the operation of event 0x" << std::hex << op.event
      << " is not done after " << kHangBound;
}

void Program::Settle(Operation* op) {
  if (op->reaped) return;
  WaitDone(*op);
  Reap(*op);
}

// Settles everything using a pinned host buffer's memory.
void Program::SettleHostBuffer(uint64_t id) {
  const std::vector<Operation*> users = host_buffers_.at(id).users;
  for (Operation* op : users) Settle(op);
}

void Program::ReapDone() {
  for (const auto& op : operations_) {
    if (!op->reaped && op->done.HasBeenNotified()) Reap(*op);
  }
}

void Program::Remove(std::vector<Operation*>& list, const Operation* op) {
  list.erase(std::remove(list.begin(), list.end(), op), list.end());
}

// Takes a finished operation out of flight, checks its status and the
// bytes it moved, and records what it wrote.
void Program::Reap(Operation& op) {
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
        TPUSHIM_FUZZ_CHECK(std::all_of(op.host, op.host + op.size,
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
bool Program::CheckDependencies(const Operation& op) {
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

DeviceBufferModel* Program::FindDeviceBuffer(uint64_t id) {
  const auto it = device_buffers_.find(id);
  return it == device_buffers_.end() ? nullptr : &it->second;
}

// Records `op` as writing [offset, +size) of buffer `id`: the range is
// unknown from now on, and every operation in flight on it is in
// conflict with this one.
void Program::StartWrite(Operation* op, uint64_t id, uint64_t offset) {
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
void Program::StartRead(Operation* op, uint64_t id, uint64_t offset) {
  DeviceBufferModel& b = device_buffers_.at(id);
  op->read_buffer = id;
  op->read_offset = offset;
  op->data_known =
      std::all_of(b.known.begin() + offset, b.known.begin() + offset + op->size,
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
Operation* Program::Track(std::unique_ptr<Operation> owned, uint64_t event) {
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

}  // namespace tpushim::fuzz::capi_sequence_internal
