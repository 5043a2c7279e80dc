#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "common/mutex.h"
#include "fuzz/capi_sequence_internal.h"
#include "fuzz/fuzz_check.h"
#include "tpushim/c_api.h"

namespace tpushim::fuzz::capi_sequence_internal {
namespace {

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

}  // namespace

// ---- Events ----

void Program::IsReady() {
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
void Program::CheckReadiness(Operation& op, bool ready, bool done_before) {
  TPUSHIM_FUZZ_CHECK(ready || (!op.seen_ready && !done_before))
      << "event 0x" << std::hex << op.event << " not ready after "
      << (op.seen_ready ? "it was" : "its callback ran");
  op.seen_ready |= ready;
}

// A status seen for the event is the one every other observer sees
// (Reap compares the callback's with the ones seen before it).
void Program::Observe(Operation& op, const Result& status) {
  const Result* before = op.reaped     ? &op.status
                         : op.observed ? &*op.observed
                                       : nullptr;
  if (before != nullptr) {
    TPUSHIM_FUZZ_CHECK(before->code == status.code &&
                       before->message == status.message)
        << "event 0x" << std::hex << op.event << " was " << *before << ", now "
        << status;
  }
  op.observed = status;
}

void Program::Await() {
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

void Program::AwaitWithTimeout() {
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

void Program::AddCallback() {
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

void Program::DestroyEvent() {
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

}  // namespace tpushim::fuzz::capi_sequence_internal
