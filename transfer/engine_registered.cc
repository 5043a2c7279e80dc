// Registered host memory: a caller's own range, pinned once, excluded from
// fork and made a host window of every device, so that transfers inside it
// take the zero-copy path whatever their size (PJRT's DmaMap).

#include <sys/mman.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/human_bytes.h"
#include "common/status_macros.h"
#include "env/fork_guard.h"
#include "env/host_facts.h"
#include "logging/log.h"
#include "transfer/engine.h"

namespace tpushim::transfer_internal {
namespace {

std::string Range(uintptr_t begin, uintptr_t end) {
  return absl::StrFormat("[0x%x, 0x%x)", begin, end);
}

}  // namespace

void RegistrationUse::Reset() {
  if (registration_ != nullptr) {
    engine_->DropRegistrationUse(*registration_);
    registration_.reset();
  }
}

std::shared_ptr<Registration> Engine::FindRegistrationLocked(
    const void* host, uint64_t size) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(host);
  auto it = registrations_.upper_bound(begin);
  if (it == registrations_.begin()) return nullptr;
  --it;
  const Registration& r = *it->second;
  if (r.state != Registration::State::kLive || begin < r.begin ||
      begin >= r.end || size > r.end - begin) {
    return nullptr;
  }
  return it->second;
}

RegistrationUse Engine::TakeRegistrationUse(const void* host, uint64_t size) {
  MutexLock lock(&reg_mu_);
  std::shared_ptr<Registration> r = FindRegistrationLocked(host, size);
  if (r == nullptr) return RegistrationUse();
  ++r->users;
  return RegistrationUse(this, std::move(r));
}

void Engine::DropRegistrationUse(Registration& r) {
  bool last;
  {
    MutexLock lock(&reg_mu_);
    last = --r.users == 0;
  }
  if (last) reg_cv_.SignalAll();
}

absl::Status Engine::PinError(const absl::Status& s, const void* data,
                              uint64_t size) {
  std::string text = absl::StrCat(
      "RegisterHostMemory: pinning the ", size, " bytes at 0x",
      absl::Hex(reinterpret_cast<uintptr_t>(data)), " failed: ", s.message());
  if (!os_->HasIpcLockCapability()) {
    const ResourceLimit limit =
        os_->GetMemlockLimit().value_or(ResourceLimit{});
    // What the process would lock with it: the registration, what the
    // engine holds pinned now, the region and the bounce pool.
    const uint64_t need = size + pins_.pinned_bytes() +
                          (region_ != nullptr ? region_->size() : 0) +
                          (bounce_ != nullptr ? bounce_->size() : 0);
    if (limit.soft != ResourceLimit::kUnlimited) {
      absl::StrAppend(&text, "; the RLIMIT_MEMLOCK soft limit is ",
                      BytesWithHumanReadable(limit.soft),
                      " and the process lacks CAP_IPC_LOCK; ",
                      MemlockRaiseAdvice(limit, need));
    }
  }
  return absl::Status(s.code(), text);
}

absl::StatusOr<uint64_t> Engine::RegisterHostMemory(const void* data,
                                                    uint64_t size) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  if (data == nullptr || size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterHostMemory: ",
        data == nullptr ? "the host memory is null" : "the size is 0",
        " (data 0x", absl::Hex(begin), ", size ", size,
        "); register at least one byte of the caller's memory"));
  }
  if (begin + size < begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterHostMemory: the range at 0x", absl::Hex(begin),
                     " of ", size, " bytes wraps around the address space"));
  }
  const uintptr_t end = begin + size;
  for (Device* dev : devices_) {
    const uint32_t align = dev->info().window_alignment;
    if (align > 1 && (begin % align != 0 || size % align != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterHostMemory: ", dev->info().name, " can DMA only ", align,
          "-byte aligned host memory in whole ", align,
          "-byte pages, and the range ", Range(begin, end), " (", size,
          " bytes) is not; register a range whose start and size are "
          "multiples of ",
          align));
    }
  }
  const auto overlaps = [&](const void* base, uint64_t length) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(base);
    return length > 0 && begin < b + length && b < end;
  };
  if (region_ != nullptr && overlaps(region_->base(), region_->size())) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(region_->base());
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterHostMemory: the range ", Range(begin, end),
        " overlaps the premapped region ", Range(b, b + region_->size()),
        ", which every device DMAs already; transfers from pinned host "
        "buffers are zero-copy without registering"));
  }
  if (bounce_ != nullptr && overlaps(bounce_->base(), bounce_->size())) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(bounce_->base());
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterHostMemory: the range ", Range(begin, end),
        " overlaps the transfer engine's bounce pool ",
        Range(b, b + bounce_->size()), ", which is the runtime's own memory"));
  }

  // Claim the range (overlapping registrations are refused from here on),
  // then pin and map it without the lock.
  auto r = std::make_shared<Registration>();
  r->begin = begin;
  r->end = end;
  {
    MutexLock lock(&reg_mu_);
    if (registrations_closed_) {
      return absl::FailedPreconditionError(
          "the transfer engine has been shut down");
    }
    auto next = registrations_.lower_bound(begin);
    const Registration* clash = nullptr;
    if (next != registrations_.end() && next->second->begin < end) {
      clash = next->second.get();
    } else if (next != registrations_.begin() &&
               std::prev(next)->second->end > begin) {
      clash = std::prev(next)->second.get();
    }
    if (clash != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterHostMemory: the range ", Range(begin, end), " (", size,
          " bytes) overlaps the registered range ",
          Range(clash->begin, clash->end), " (", clash->end - clash->begin,
          " bytes); unregister it first, or register the part outside it"));
    }
    r->id = next_registration_id_++;
    registrations_.emplace(begin, r);
  }
  const auto abandon = [&] {
    {
      MutexLock lock(&reg_mu_);
      registrations_.erase(begin);
    }
    reg_cv_.SignalAll();
  };

  // 1. Pinned once, long-term (mlock where the kernel cannot), counted with
  // the pinned path's pins so that a transfer's unpin never undoes it.
  absl::StatusOr<PinTracker::Lease> lease = pins_.Pin(data, size);
  if (!lease.ok()) {
    abandon();
    return PinError(lease.status(), data, size);
  }
  r->lease = *std::move(lease);
  const std::string note = os_->TakePinNote();
  if (!note.empty()) LOG(INFO) << note;
  // 2. Not inherited by a fork() child: the whole pages inside the range
  // (pages it shares with other memory stay, or a child would lose that
  // memory too).
  const uintptr_t page = std::max<uintptr_t>(os_->PageSize(), 1);
  const uintptr_t fork_begin = (begin + page - 1) / page * page;
  const uintptr_t fork_end = end / page * page;
  if (fork_end > fork_begin) {
    absl::Status s = ExcludeFromFork(
        *os_, reinterpret_cast<void*>(fork_begin), fork_end - fork_begin,
        absl::StrCat("the registered host memory ", Range(begin, end)));
    if (!s.ok()) {
      pins_.Unpin(std::move(r->lease));
      abandon();
      return absl::Status(s.code(),
                          absl::StrCat("RegisterHostMemory: ", s.message()));
    }
    r->fork_begin = fork_begin;
    r->fork_bytes = fork_end - fork_begin;
  }
  // 3. A host window of every device (an IOMMU mapping for vfio://).
  for (Device* dev : devices_) {
    absl::StatusOr<HostWindowId> w = dev->RegisterHostWindow(data, size);
    if (!w.ok()) {
      TearDownRegistration(*r);
      abandon();
      return absl::Status(
          w.status().code(),
          absl::StrCat("RegisterHostMemory: mapping the range ",
                       Range(begin, end), " for DMA by ", dev->info().name,
                       " failed: ", w.status().message()));
    }
    r->windows.push_back(*w);
  }
  {
    MutexLock lock(&reg_mu_);
    r->state = Registration::State::kLive;
    registered_bytes_now_ += size;
    live_registrations_.fetch_add(1, std::memory_order_release);
  }
  reg_cv_.SignalAll();  // a Shutdown may wait for it to settle
  VLOG(1) << "Registered host memory " << r->id << ": " << Range(begin, end)
          << " (" << size << " bytes) for DMA by " << devices_.size()
          << " device(s)";
  return r->id;
}

void Engine::TearDownRegistration(Registration& r) {
  for (size_t i = 0; i < r.windows.size(); ++i) {
    absl::Status s = devices_[i]->UnregisterHostWindow(r.windows[i]);
    if (!s.ok()) {
      LOG(ERROR) << "Unmapping registered host memory " << Range(r.begin, r.end)
                 << " from " << devices_[i]->info().name << ": " << s;
    }
  }
  r.windows.clear();
  if (r.fork_bytes > 0) {
    void* const base = reinterpret_cast<void*>(r.fork_begin);
    ForgetForkExclusion(base);
    // The caller's memory lives on: a later fork() child inherits it again.
    absl::Status s = os_->Madvise(base, r.fork_bytes, MADV_DOFORK);
    if (!s.ok()) {
      LOG(ERROR) << "Letting fork() children inherit the unregistered host "
                 << "memory " << Range(r.begin, r.end)
                 << " again (madvise MADV_DOFORK) failed: " << s;
    }
    r.fork_bytes = 0;
  }
  if (!r.lease.segments.empty()) pins_.Unpin(std::move(r.lease));
  r.lease = PinTracker::Lease{};
}

absl::Status Engine::UnregisterHostMemory(uint64_t id) {
  if (ForkedChildOf(owner_pid_)) {
    return ForkedChildError("This System's transfer engine", owner_pid_);
  }
  std::shared_ptr<Registration> r;
  {
    MutexLock lock(&reg_mu_);
    for (const auto& [begin, candidate] : registrations_) {
      if (candidate->id == id &&
          candidate->state == Registration::State::kLive) {
        r = candidate;
        break;
      }
    }
    if (r == nullptr) {
      return registrations_closed_
                 ? absl::FailedPreconditionError(
                       "the transfer engine has been shut down (its host "
                       "memory registrations were released then)")
                 : absl::InvalidArgumentError(
                       absl::StrCat("UnregisterHostMemory: ", id,
                                    " is not a live host memory registration"));
    }
    // No new transfer uses it from here on; wait for those that do.
    r->state = Registration::State::kClosing;
    live_registrations_.fetch_sub(1, std::memory_order_acq_rel);
    while (r->users > 0) reg_cv_.Wait(&reg_mu_);
  }
  TearDownRegistration(*r);
  {
    MutexLock lock(&reg_mu_);
    registrations_.erase(r->begin);
    registered_bytes_now_ -= r->end - r->begin;
  }
  reg_cv_.SignalAll();
  VLOG(1) << "Unregistered host memory " << id << ": "
          << Range(r->begin, r->end);
  return absl::OkStatus();
}

void Engine::ReleaseRegistrations() {
  std::vector<std::shared_ptr<Registration>> left;
  {
    MutexLock lock(&reg_mu_);
    registrations_closed_ = true;
    // Another thread's Register or Unregister finishes first (every
    // operation is done, so none waits for users).
    while (std::any_of(registrations_.begin(), registrations_.end(),
                       [](const auto& e) {
                         return e.second->state != Registration::State::kLive;
                       })) {
      reg_cv_.Wait(&reg_mu_);
    }
    for (auto& [begin, r] : registrations_) {
      r->state = Registration::State::kClosing;
      left.push_back(r);
    }
    live_registrations_.store(0, std::memory_order_release);
  }
  if (left.empty()) return;
  uint64_t bytes = 0;
  for (const auto& r : left) bytes += r->end - r->begin;
  LOG(WARNING) << "The transfer engine shuts down with " << left.size()
               << " host memory registration(s) of " << bytes
               << " bytes in all still live; releasing them (unmapped from "
                  "the devices and unpinned; a later Unregister does "
                  "nothing)";
  for (const auto& r : left) TearDownRegistration(*r);
  MutexLock lock(&reg_mu_);
  registrations_.clear();
  registered_bytes_now_ = 0;
}

}  // namespace tpushim::transfer_internal
