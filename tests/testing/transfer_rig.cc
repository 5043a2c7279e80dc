#include "tests/testing/transfer_rig.h"

#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "device/devices.h"
#include "env/options.h"
#include "tests/testing/forwarding_device.h"

namespace tpushim::testutil {
namespace {

// A device that states a host alignment and counts the descriptors that
// break it (the device under it moves them anyway, so a test sees both the
// data and the count), and counts descriptors by direction and hint.
class AlignedDevice : public ForwardingDevice {
 public:
  AlignedDevice(std::unique_ptr<Device> device, uint32_t alignment,
                uint32_t block_bytes,
                std::shared_ptr<std::atomic<uint64_t>> misaligned,
                std::shared_ptr<std::mutex> counts_mu,
                std::shared_ptr<TransferRig::DescriptorCounts> counts)
      : ForwardingDevice(std::move(device)),
        info_(inner().info()),
        misaligned_(std::move(misaligned)),
        counts_mu_(std::move(counts_mu)),
        counts_(std::move(counts)) {
    info_.host_alignment = alignment;
    info_.block_bytes = block_bytes;
  }
  const DeviceInfo& info() const override { return info_; }
  void SetWindowAlignment(uint32_t alignment) {
    info_.window_alignment = alignment;
  }
  absl::StatusOr<HostWindowId> RegisterHostWindow(const void* base,
                                                  uint64_t length) override {
    absl::StatusOr<HostWindowId> id =
        ForwardingDevice::RegisterHostWindow(base, length);
    if (id.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      bases_[*id] = reinterpret_cast<uintptr_t>(base);
      lengths_[*id] = length;
    }
    return id;
  }
  // Registered whole, so that Windows() and the alignment count see it.
  absl::StatusOr<HostWindowId> ReserveHostWindow(const void* base,
                                                 uint64_t length) override {
    return RegisterHostWindow(base, length);
  }
  absl::Status ExtendHostWindow(HostWindowId, uint64_t) override {
    return absl::OkStatus();
  }
  absl::Status UnregisterHostWindow(HostWindowId window) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bases_.erase(window);
      lengths_.erase(window);
    }
    return ForwardingDevice::UnregisterHostWindow(window);
  }
  size_t Submit(DmaDirection direction,
                absl::Span<const DmaDescriptor> descriptors) override {
    {
      std::lock_guard<std::mutex> lock(*counts_mu_);
      for (const DmaDescriptor& d : descriptors) {
        const int dir = static_cast<int>(d.direction);
        ++(d.host_reads_next ? counts_->host_reads_next : counts_->plain)[dir];
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const DmaDescriptor& d : descriptors) {
        if (d.direction == DmaDirection::kDeviceToDevice) continue;
        auto it = bases_.find(d.host_window);
        if (it != bases_.end() &&
            (it->second + d.host_offset) % info_.host_alignment != 0) {
          misaligned_->fetch_add(1);
        }
      }
    }
    return ForwardingDevice::Submit(direction, descriptors);
  }

  std::vector<std::pair<const void*, uint64_t>> Windows() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<const void*, uint64_t>> windows;
    for (const auto& [id, base] : bases_) {
      windows.emplace_back(reinterpret_cast<const void*>(base), lengths_[id]);
    }
    return windows;
  }

 private:
  DeviceInfo info_;
  std::shared_ptr<std::atomic<uint64_t>> misaligned_;
  std::shared_ptr<std::mutex> counts_mu_;
  std::shared_ptr<TransferRig::DescriptorCounts> counts_;
  std::mutex mu_;
  std::map<HostWindowId, uintptr_t> bases_;
  std::map<HostWindowId, uint64_t> lengths_;
};

}  // namespace

uint64_t TransferRig::misaligned_dma() const { return misaligned_dma_->load(); }

TransferRig::DescriptorCounts TransferRig::descriptors() const {
  std::lock_guard<std::mutex> lock(*counts_mu_);
  return *counts_;
}

std::vector<std::pair<const void*, uint64_t>> TransferRig::HostWindows(
    int device) {
  auto* d = dynamic_cast<AlignedDevice*>(devices_[device].get());
  return d == nullptr ? std::vector<std::pair<const void*, uint64_t>>{}
                      : d->Windows();
}

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
  TPUSHIM_ASSIGN_OR_RETURN(Options options, ResolveOptions(*rig->env_os_, api));
  rig->faults_ = std::make_unique<FaultInjector>(options.faults.value);
  rig->os_ = std::make_unique<FaultInjectingOs>(rig->env_os_.get(),
                                                rig->faults_.get());
  TPUSHIM_ASSIGN_OR_RETURN(
      rig->region_,
      PremappedRegion::Create(options, rig->os_.get(), rig->faults_.get()));
  if (params.open_devices) {
    TPUSHIM_ASSIGN_OR_RETURN(rig->devices_, params.open_devices());
  } else {
    TPUSHIM_ASSIGN_OR_RETURN(
        rig->devices_,
        OpenDevices(options.device.value, rig->os_.get(), rig->faults_.get()));
  }
  if (params.host_alignment > 1 || params.block_bytes > 1 ||
      params.window_alignment > 1 || params.count_descriptors) {
    for (auto& d : rig->devices_) {
      d = std::make_unique<AlignedDevice>(
          std::move(d), params.host_alignment, params.block_bytes,
          rig->misaligned_dma_, rig->counts_mu_, rig->counts_);
      static_cast<AlignedDevice&>(*d).SetWindowAlignment(
          params.window_alignment);
    }
  }
  if (params.wrap_device) {
    for (auto& d : rig->devices_) d = params.wrap_device(std::move(d));
  }
  std::vector<Device*> devices;
  for (auto& d : rig->devices_) devices.push_back(d.get());
  if (!params.memory_profile.empty()) {
    TPUSHIM_ASSIGN_OR_RETURN(
        params.engine.memory_profile,
        MemoryProfile::ForDevices(params.memory_profile, rig->os_.get(),
                                  devices));
  }
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
    if (n > 0)
      absl::StrAppend(&report, report.empty() ? "" : ", ", what, " ", n);
  };
  add("mapped bytes", os_->mapped_bytes());
  add("locked bytes", os_->locked_bytes());
  add("pinned bytes", os_->pinned_bytes());
  add("open files", os_->open_files());
  return report;
}

}  // namespace tpushim::testutil
