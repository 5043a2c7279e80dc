#include "device/devices.h"

#include "device/nvme/nvme_device.h"
#include "device/sim/sim_device.h"

namespace tpushim {

absl::StatusOr<std::vector<std::unique_ptr<Device>>> OpenDevices(
    const DeviceUrl& url, Os* os, FaultInjector* faults,
    const std::vector<int>& host_chips) {
  switch (url.scheme) {
    case DeviceUrl::Scheme::kSim:
      return CreateSimDevices(url, os, faults, SimDeviceOptions{}, host_chips);
    case DeviceUrl::Scheme::kVfio:
      return OpenNvmeDevices(url, os, faults);
  }
  return absl::InvalidArgumentError("unknown device URL scheme");
}

}  // namespace tpushim
