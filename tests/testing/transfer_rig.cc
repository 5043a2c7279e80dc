#include "tests/testing/transfer_rig.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "device/devices.h"
#include "env/options.h"

namespace tpushim::testutil {

absl::StatusOr<std::unique_ptr<TransferRig>> TransferRig::Create(
    Params params) {
  std::unique_ptr<TransferRig> rig(new TransferRig());
  rig->env_os_ = std::make_unique<FixedEnvironmentOs>(Os::Default());
  OptionOverrides api;
  api.premapped_buffer_size = params.region_bytes;
  if (params.threshold != 0) {
    api.premapped_buffer_transfer_threshold_bytes = params.threshold;
  }
  api.device = params.device_url;
  api.faults = params.faults;
  api.prefault_threads = 1;
  TPUSHIM_ASSIGN_OR_RETURN(Options options,
                           ResolveOptions(*rig->env_os_, api));
  rig->faults_ = std::make_unique<FaultInjector>(options.faults.value);
  rig->os_ = std::make_unique<FaultInjectingOs>(rig->env_os_.get(),
                                                rig->faults_.get());
  TPUSHIM_ASSIGN_OR_RETURN(
      rig->region_,
      PremappedRegion::Create(options, rig->os_.get(), rig->faults_.get()));
  TPUSHIM_ASSIGN_OR_RETURN(rig->devices_,
                           OpenDevices(options.device.value, rig->os_.get(),
                                       rig->faults_.get()));
  std::vector<Device*> devices;
  for (auto& d : rig->devices_) devices.push_back(d.get());
  TPUSHIM_ASSIGN_OR_RETURN(
      rig->engine_,
      TransferEngine::Create(std::move(devices), rig->region_.get(),
                             rig->os_.get(), params.engine));
  return rig;
}

TransferRig::~TransferRig() {
  engine_.reset();
  devices_.clear();
  region_.reset();
}

std::string TransferRig::TearDownAndReport() {
  engine_.reset();
  devices_.clear();
  region_.reset();
  std::string report;
  auto add = [&](const char* what, uint64_t n) {
    if (n > 0) absl::StrAppend(&report, report.empty() ? "" : ", ", what, " ",
                               n);
  };
  add("mapped bytes", os_->mapped_bytes());
  add("locked bytes", os_->locked_bytes());
  add("pinned bytes", os_->pinned_bytes());
  add("open files", os_->open_files());
  return report;
}

}  // namespace tpushim::testutil
