#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "logging/log.h"
#include "transfer/engine.h"

namespace tpushim::transfer_internal {

// ---- Device buffers --------------------------------------------------------

absl::StatusOr<DeviceBuffer> Engine::Allocate(int device, uint64_t size) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  if (device < 0 || device >= device_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate: device ", device,
                     " does not exist (devices 0..", device_count() - 1, ")"));
  }
  if (size == 0) {
    return absl::InvalidArgumentError(
        "Allocate: a device buffer must be at least 1 byte");
  }
  TPUSHIM_ASSIGN_OR_RETURN(uint64_t address,
                           devices_[device]->AllocateMemory(size));
  auto a = std::make_shared<Allocation>();
  a->engine_serial = serial_;
  a->device = device;
  a->address = address;
  a->size = size;
  {
    MutexLock lock(&mu_);
    if (!shutting_down_) {
      live_.emplace(a.get(), a);
      live_bytes_ += size;
      return DeviceBuffer(std::move(a));
    }
  }
  (void)devices_[device]->FreeMemory(address);
  return CheckOpen();
}

absl::StatusOr<std::shared_ptr<Allocation>> Engine::UseBuffer(
    const DeviceBuffer& buffer, uint64_t offset, uint64_t size,
    absl::string_view what) {
  std::shared_ptr<Allocation> a = AllocationOf(buffer);
  if (a == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the device buffer handle is empty"));
  }
  if (a->engine_serial != serial_) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the device buffer belongs to another transfer engine"));
  }
  if (offset > a->size || size > a->size - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: [%d, +%d) lies outside the device buffer of %d bytes", what,
        offset, size, a->size));
  }
  const DeviceInfo& info = devices_[a->device]->info();
  if (info.block_bytes > 1 &&
      (offset % info.block_bytes != 0 || size % info.block_bytes != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s moves whole %d-byte blocks of device memory: the offset (%d) "
        "and size (%d) must be multiples of %d",
        what, info.name, info.block_bytes, offset, size, info.block_bytes));
  }
  MutexLock lock(&a->mu);
  if (a->deallocating || a->freed) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the device buffer (device %d, address 0x%x) has been "
        "deallocated",
        what, a->device, a->address));
  }
  ++a->ops;
  return a;
}

void Engine::ReleaseBufferUse(const std::shared_ptr<Allocation>& a) {
  bool step = false;
  {
    MutexLock lock(&a->mu);
    step = --a->ops == 0 && a->deallocating && !a->freed;
  }
  if (step) DeallocStep(a);
}

absl::StatusOr<Event> Engine::Deallocate(const DeviceBuffer& buffer,
                                         absl::Span<const Event> wait_for) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  std::shared_ptr<Allocation> a = AllocationOf(buffer);
  if (a == nullptr || a->engine_serial != serial_) {
    return absl::InvalidArgumentError(
        a == nullptr
            ? "Deallocate: the device buffer handle is empty"
            : "Deallocate: the device buffer belongs to another transfer "
              "engine");
  }
  auto event = std::make_shared<EventState>(&callbacks_, this);
  bool no_ops;
  {
    MutexLock lock(&a->mu);
    if (a->deallocating || a->freed) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Deallocate: the device buffer (device %d, address 0x%x) has "
          "already been deallocated",
          a->device, a->address));
    }
    a->deallocating = true;
    a->dealloc_event = event;
    // One for each dependency, one for the operations in flight (taken by
    // the last of them to finish, or below when there are none), one held
    // here until every continuation is registered.
    a->dealloc_waiting = static_cast<int>(wait_for.size()) + 2;
    no_ops = a->ops == 0;
  }
  {
    MutexLock lock(&idle_mu_);
    ++unfinished_;
  }
  events_not_ready_.fetch_add(1, std::memory_order_acq_rel);
  for (const Event& e : wait_for) {
    e.state()->AddContinuation([this, a](const absl::Status& s) {
      if (!s.ok()) {
        MutexLock lock(&a->mu);
        if (a->dealloc_error.ok()) a->dealloc_error = s;
      }
      DeallocStep(a);
    });
  }
  if (no_ops) DeallocStep(a);
  DeallocStep(a);
  return Event(event);
}

void Engine::DeallocStep(const std::shared_ptr<Allocation>& a) {
  {
    MutexLock lock(&a->mu);
    if (--a->dealloc_waiting > 0) return;
  }
  // Freeing may give pages back to the OS: not on a DMA thread.
  host_workers_[a->device]->Post([this, a] {
    FreeAllocation(a);
    std::shared_ptr<EventState> event;
    absl::Status status;
    {
      MutexLock lock(&a->mu);
      event = std::move(a->dealloc_event);
      status = a->dealloc_error;
    }
    events_not_ready_.fetch_sub(1, std::memory_order_acq_rel);
    if (event) event->Resolve(status);
    MutexLock lock(&idle_mu_);
    if (--unfinished_ == 0) idle_cv_.SignalAll();
  });
}

void Engine::FreeAllocation(const std::shared_ptr<Allocation>& a) {
  {
    MutexLock lock(&a->mu);
    if (a->freed) return;
    a->freed = true;
  }
  absl::Status s = devices_[a->device]->FreeMemory(a->address);
  if (!s.ok()) LOG(ERROR) << "Freeing a device buffer failed: " << s;
  MutexLock lock(&mu_);
  if (live_.erase(a.get()) > 0) live_bytes_ -= a->size;
}

}  // namespace tpushim::transfer_internal
