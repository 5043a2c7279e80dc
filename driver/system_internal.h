// SystemFactory: brings a System up through a given Os — the seam tests
// use to fake the host or inject failures into every OS call of start-up.
// Not part of the public API.
//
// Thread-safety: as System::Create.

#ifndef TPUSHIM_DRIVER_SYSTEM_INTERNAL_H_
#define TPUSHIM_DRIVER_SYSTEM_INTERNAL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "env/os.h"
#include "tpushim/options.h"
#include "tpushim/system.h"

namespace tpushim {

struct SystemFactory {
  // As System::Create, with every OS call (environment included) through
  // `os`, which must outlive the system. Faults from TPUSHIM_FAULTS are
  // injected on top of `os`.
  static absl::StatusOr<std::unique_ptr<System>> Create(
      const OptionOverrides& overrides, Os* os);
};

}  // namespace tpushim

#endif  // TPUSHIM_DRIVER_SYSTEM_INTERNAL_H_
