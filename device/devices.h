// OpenDevices: the devices a TPUSHIM_DEVICE URL names, from whichever
// backend serves its scheme. The only place that knows the backends.
//
// Thread-safety: a pure factory.

#ifndef TPUSHIM_DEVICE_DEVICES_H_
#define TPUSHIM_DEVICE_DEVICES_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "device/device.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "env/os.h"

namespace tpushim {

// Opens every device of `url`, numbered 0 .. N-1. `os` and `faults`
// (nullable) must outlive them. On error nothing stays open or mapped.
// `host_chips` picks the chips of the host to open, in device order
// (empty = all; a vfio:// URL has the one chip 0).
absl::StatusOr<std::vector<std::unique_ptr<Device>>> OpenDevices(
    const DeviceUrl& url, Os* os, FaultInjector* faults,
    const std::vector<int>& host_chips = {});

}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_DEVICES_H_
