#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/saturating.h"
#include "common/status_macros.h"
#include "device/hbm_report.h"
#include "logging/log.h"
#include "transfer/engine.h"

namespace tpushim::transfer_internal {

// ---- Device buffers --------------------------------------------------------

absl::StatusOr<DeviceBuffer> Engine::Allocate(int device, uint64_t size) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_RETURN_IF_ERROR(CheckDevice(device));
  if (size == 0) {
    return absl::InvalidArgumentError(
        "Allocate: a device buffer must be at least 1 byte");
  }
  auto a = std::make_shared<Allocation>();
  a->device = device;
  a->size = size;
  a->image_bytes = size;
  a->unpadded = size;
  return AllocateLive(std::move(a));
}

absl::StatusOr<DeviceBuffer> Engine::Allocate(int device,
                                              const DeviceBufferSpec& spec) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_RETURN_IF_ERROR(CheckDevice(device));
  absl::StatusOr<Shape> parsed = ParseShape(spec.shape);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate: ", parsed.status().message()));
  }
  if (parsed->is_tuple) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Allocate: ", spec.shape,
        " is a tuple; each of its elements is a device buffer of its own, "
        "allocate them one by one"));
  }
  TPUSHIM_ASSIGN_OR_RETURN(ShapeSizes sizes, ComputeSizes(parsed->array));
  if (sizes.padded_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Allocate: ", ToString(parsed->array),
        " has no elements; a device buffer must be at least 1 byte"));
  }
  TPUSHIM_ASSIGN_OR_RETURN(RelayoutPlan plan,
                           RelayoutPlan::Create(parsed->array));
  auto shape = std::make_shared<BufferShape>(BufferShape{
      .array = parsed->array,
      .text = ToString(parsed->array),
      .plan = std::move(plan),
      .unpadded_bytes = sizes.unpadded_bytes,
      .host_bytes = HostBytes(parsed->array),
  });
  auto a = std::make_shared<Allocation>();
  a->device = device;
  const uint64_t block = devices_[device]->info().block_bytes;
  if (sizes.padded_bytes > UINT64_MAX - block) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate: ", ToString(parsed->array),
                     " is too large for ", devices_[device]->info().name));
  }
  a->size = (sizes.padded_bytes + block - 1) / block * block;
  a->image_bytes = sizes.padded_bytes;
  a->unpadded = sizes.unpadded_bytes;
  a->shape = std::move(shape);
  a->label = spec.label;
  a->op_metadata = spec.op_metadata;
  return AllocateLive(std::move(a));
}

absl::Status Engine::CheckDevice(int device) const {
  if (device < 0 || device >= device_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate: device ", device,
                     " does not exist (devices 0..", device_count() - 1, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceBuffer> Engine::AllocateLive(
    std::shared_ptr<Allocation> a) {
  absl::StatusOr<uint64_t> address =
      devices_[a->device]->AllocateMemory(a->size);
  if (!address.ok()) {
    if (!absl::IsResourceExhausted(address.status())) return address.status();
    if (memory_profile_ && memory_profile_->Failed(ProfileBuffer(*a))) {
      memory_profile_->Flush();
    }
    return absl::ResourceExhaustedError(
        absl::StrCat(address.status().message(), "\n", HbmReport(*a)));
  }
  a->engine_serial = serial_;
  a->address = *address;
  bool flush = false;
  bool live = false;
  {
    MutexLock lock(&mu_);
    if (!shutting_down_) {
      live = true;
      a->serial = next_allocation_serial_++;
      live_.emplace(a.get(), a);
      live_bytes_ += a->size;
      DeviceMemoryUse& use = memory_use_[a->device];
      ++use.buffers;
      use.padded_bytes += a->image_bytes;
      use.unpadded_bytes += a->unpadded;
      use.peak_padded_bytes = std::max(use.peak_padded_bytes, use.padded_bytes);
      use.peak_unpadded_bytes =
          std::max(use.peak_unpadded_bytes, use.unpadded_bytes);
      ++use.num_allocs;
      use.largest_alloc_size = std::max(use.largest_alloc_size, a->image_bytes);
      if (memory_profile_)
        flush = memory_profile_->Allocated(ProfileBuffer(*a));
    }
  }
  if (flush) memory_profile_->Flush();
  if (live) return DeviceBuffer(std::move(a));
  (void)devices_[a->device]->FreeMemory(a->address);
  return CheckOpen();
}

std::string Engine::HbmReport(const Allocation& request) const {
  const Device& dev = *devices_[request.device];
  const uint64_t granule = std::max<uint64_t>(1, dev.GetMemoryStats().granule);
  auto held = [granule](uint64_t n) { return RoundUpSaturating(n, granule); };
  auto entry = [&](const Allocation& a, bool failed) {
    HbmBuffer b;
    b.padded_bytes = a.image_bytes;
    b.unpadded_bytes = a.unpadded;
    b.held_bytes = held(a.size);
    if (a.shape != nullptr) b.shape = a.shape->array;
    b.label = a.label;
    b.op_metadata = a.op_metadata;
    b.failed_request = failed;
    return b;
  };
  std::vector<std::pair<uint64_t, const Allocation*>> live;
  std::vector<HbmBuffer> buffers;
  {
    MutexLock lock(&mu_);
    for (const auto& [ptr, a] : live_) {
      if (a->device == request.device) live.emplace_back(a->serial, a.get());
    }
    std::sort(live.begin(), live.end());
    buffers.reserve(live.size() + 1);
    for (const auto& [serial, a] : live) buffers.push_back(entry(*a, false));
  }
  buffers.push_back(entry(request, true));
  return FormatHbmReport(dev.info().hbm_bytes, buffers);
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
  // A chunked transfer without its last chunk never gets it now.
  AbandonChunked(
      *a, absl::CancelledError("the device buffer was deallocated before the "
                               "chunked transfer's last chunk"));
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
    // Every operation on it has finished: its order holds nothing more.
    a->order.Clear();
    a->chunk_order.Clear();
    a->chunked_after.clear();
  }
  // Counted out before the device frees it: an allocation that reuses the
  // memory is counted in only after, so the counts and the memory profile
  // never hold more than the device does.
  bool flush = false;
  {
    MutexLock lock(&mu_);
    if (live_.erase(a.get()) > 0) {
      live_bytes_ -= a->size;
      DeviceMemoryUse& use = memory_use_[a->device];
      --use.buffers;
      use.padded_bytes -= a->image_bytes;
      use.unpadded_bytes -= a->unpadded;
      if (memory_profile_) {
        flush = memory_profile_->Freed(a->device, a->serial);
      }
    }
  }
  absl::Status s = devices_[a->device]->FreeMemory(a->address);
  if (!s.ok()) LOG(ERROR) << "Freeing a device buffer failed: " << s;
  if (flush) memory_profile_->Flush();
}

MemoryProfile::Buffer Engine::ProfileBuffer(const Allocation& a) {
  return {
      .device = a.device,
      .id = a.serial,
      .device_bytes = a.size,
      .padded_bytes = a.image_bytes,
      .unpadded_bytes = a.unpadded,
      .shape = a.shape ? absl::string_view(a.shape->text) : absl::string_view(),
      .label = a.label,
      .op_metadata = a.op_metadata};
}

}  // namespace tpushim::transfer_internal
