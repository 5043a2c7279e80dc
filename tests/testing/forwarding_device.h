// ForwardingDevice: a Device that hands every call to the device under it,
// for test wrappers that change or watch a few calls and override only
// those.
//
//   class CountingDevice : public ForwardingDevice {
//    public:
//     using ForwardingDevice::ForwardingDevice;
//     size_t Submit(DmaDirection d,
//                   absl::Span<const DmaDescriptor> ds) override {
//       submitted_ += ds.size();
//       return ForwardingDevice::Submit(d, ds);
//     }
//   };

#ifndef TPUSHIM_TESTS_TESTING_FORWARDING_DEVICE_H_
#define TPUSHIM_TESTS_TESTING_FORWARDING_DEVICE_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "device/device.h"

namespace tpushim::testutil {

class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(std::unique_ptr<Device> device)
      : device_(std::move(device)) {}

  const DeviceInfo& info() const override { return device_->info(); }
  void SetCompletionSink(DmaCompletionSink* sink) override {
    device_->SetCompletionSink(sink);
  }
  absl::StatusOr<uint64_t> AllocateMemory(uint64_t size) override {
    return device_->AllocateMemory(size);
  }
  absl::Status FreeMemory(uint64_t device_address) override {
    return device_->FreeMemory(device_address);
  }
  uint64_t MemoryInUse() const override { return device_->MemoryInUse(); }
  DeviceMemoryStats GetMemoryStats() const override {
    return device_->GetMemoryStats();
  }
  absl::StatusOr<HostWindowId> RegisterHostWindow(const void* base,
                                                  uint64_t length) override {
    return device_->RegisterHostWindow(base, length);
  }
  absl::Status UnregisterHostWindow(HostWindowId window) override {
    return device_->UnregisterHostWindow(window);
  }
  absl::StatusOr<HostWindowId> ReserveHostWindow(const void* base,
                                                 uint64_t length) override {
    return device_->ReserveHostWindow(base, length);
  }
  absl::Status ExtendHostWindow(HostWindowId window, uint64_t usable) override {
    return device_->ExtendHostWindow(window, usable);
  }
  size_t Submit(DmaDirection direction,
                absl::Span<const DmaDescriptor> descriptors) override {
    return device_->Submit(direction, descriptors);
  }
  uint32_t InFlight(DmaDirection direction) const override {
    return device_->InFlight(direction);
  }
  bool Poll(DmaDirection direction, uint64_t max_length) override {
    return device_->Poll(direction, max_length);
  }
  void StopModelledDelays() override { device_->StopModelledDelays(); }
  void Shutdown() override { device_->Shutdown(); }

 protected:
  Device& inner() { return *device_; }

 private:
  const std::unique_ptr<Device> device_;
};

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_FORWARDING_DEVICE_H_
