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
//    header documents (RESOURCE_EXHAUSTED with libtpu's out-of-memory
//    texts: "That was not possible. There are …" or the name of
//    TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES; FAILED_PRECONDITION
//    with the region off), and OK for every valid transfer and for a
//    system with valid options and no faults;
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
//
// This file holds the entry points and the program's loop; the model and
// the Program are declared in fuzz/capi_sequence_internal.h, which lists
// the files defining the rest.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "driver/c_api_internal.h"
#include "env/os.h"
#include "fuzz/capi_sequence_internal.h"
#include "fuzz/fuzz_check.h"
#include "logging/log.h"
#include "tpushim/c_api.h"

namespace tpushim::fuzz::capi_sequence_internal {
namespace {

constexpr int kMaxOps = 64;

}  // namespace

const TpuShim_Api* api = nullptr;

void Program::Run() {
  for (int n = 0; n < kMaxOps && !in_.empty(); ++n) {
    ReapDone();
    Step();
  }
  Finish();
}

void Program::Step() {
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

// Destroys what is left and checks every callback ran once.
void Program::Finish() {
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
    TPUSHIM_FUZZ_CHECK(record->status.code == record->operation->status.code &&
                       record->status.message ==
                           record->operation->status.message)
        << "a callback got " << record->status << ", the event was "
        << record->operation->status;
  }
}

}  // namespace tpushim::fuzz::capi_sequence_internal

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
  tpushim::fuzz::capi_sequence_internal::api = TpuShim_GetApi();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace internal = tpushim::fuzz::capi_sequence_internal;
  internal::Program program(internal::ByteReader(data, size));
  program.Run();
  return 0;
}
