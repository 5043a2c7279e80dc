// SystemFactory: brings a System up through a given Os — the seam tests
// use to fake the host or inject failures into every OS call of start-up.
// Not part of the public API.
//
// Thread-safety: as System::Create.

#ifndef TPUSHIM_DRIVER_SYSTEM_INTERNAL_H_
#define TPUSHIM_DRIVER_SYSTEM_INTERNAL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "env/fault_injection.h"
#include "env/os.h"
#include "tpushim/options.h"
#include "tpushim/system.h"

namespace tpushim {

struct SystemFactory {
  // As System::Create, with every OS call (environment included) through
  // `os`, which must outlive the system (and logging, when this system sets
  // it up). Faults from TPUSHIM_FAULTS are injected on top of `os`.
  //
  // With `faults` (which must outlive the system), faults come from it
  // instead, and TPUSHIM_FAULTS is ignored: `faults` decides the `alloc`
  // and `dma` points, and `os` is used as it is — a FaultInjectingOs over
  // the same `faults` decides the OS points, `log_open` included. Fault
  // sweeps use this to count and fail every injectable call of a system.
  static absl::StatusOr<std::unique_ptr<System>> Create(
      const OptionOverrides& overrides, Os* os, FaultInjector* faults = nullptr,
      StartupProgressCallback progress = nullptr,
      StartupProgressUntil until = StartupProgressUntil::kCreateReturns);

  // Stops premapping the region behind the caller (if it goes on): the
  // region stops growing, so that pinned host allocations waiting for it
  // return (CANCELLED) at once, then the premapping thread is joined. For
  // System_Destroy, before it waits for the calls running on the system.
  // Thread-safe; idempotent.
  static void StopPremapping(System& system);
};

}  // namespace tpushim

#endif  // TPUSHIM_DRIVER_SYSTEM_INTERNAL_H_
