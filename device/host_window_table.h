// HostWindowTable: the host windows of one device (Device::
// RegisterHostWindow), shared by the backends. A window id carries its
// slot in the low bits and a generation above them, so a stale id — of a
// window unregistered since, whose slot a newer window took — is refused
// instead of reaching the newer window. `Extra` is what a backend keeps per
// window (an IOVA for vfio://; nothing for sim://).
//
// Errors name the device and read as a DMA fault where the device would
// take one: Find of an unknown id or a range outside the window is
// OUT_OF_RANGE; Remove of an unknown id is INVALID_ARGUMENT.
//
// Thread-safety: thread-safe; Find takes a reader lock.
//
//   HostWindowTable<uint64_t> windows("vfio:0000:01:00.0");
//   TPUSHIM_ASSIGN_OR_RETURN(HostWindowId id, windows.Add(base, n, iova));
//   TPUSHIM_ASSIGN_OR_RETURN(auto w, windows.Find(id, offset, length));

#ifndef TPUSHIM_DEVICE_HOST_WINDOW_TABLE_H_
#define TPUSHIM_DEVICE_HOST_WINDOW_TABLE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "device/device.h"

namespace tpushim {

template <typename Extra>
class HostWindowTable {
 public:
  struct Window {
    const char* base = nullptr;
    uint64_t length = 0;
    Extra extra{};
  };

  explicit HostWindowTable(std::string device_name)
      : device_name_(std::move(device_name)) {}
  HostWindowTable(const HostWindowTable&) = delete;
  HostWindowTable& operator=(const HostWindowTable&) = delete;

  // INVALID_ARGUMENT for a null base or a zero length (what
  // Device::RegisterHostWindow refuses before doing anything).
  absl::Status Check(const void* base, uint64_t length) const {
    if (base != nullptr && length != 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "RegisterHostWindow(%p, %d) on %s: the window must be a non-empty "
        "range at a non-null address",
        base, length, device_name_));
  }

  // Check(), then RESOURCE_EXHAUSTED when every slot is taken.
  absl::StatusOr<HostWindowId> Add(const void* base, uint64_t length,
                                   Extra extra) {
    if (absl::Status valid = Check(base, length); !valid.ok()) return valid;
    WriterMutexLock lock(&mu_);
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      if (slots_.size() > kIndexMask) {
        return absl::ResourceExhaustedError(
            absl::StrCat("RegisterHostWindow on ", device_name_, ": all ",
                         kIndexMask + 1, " host windows are registered"));
      }
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& s = slots_[index];
    s.window = Window{static_cast<const char*>(base), length, std::move(extra)};
    s.generation = (s.generation + 1) & kGenerationMask;
    s.live = true;
    return (s.generation << kIndexBits) | index;
  }

  // Unregisters `id` and returns what it was.
  absl::StatusOr<Window> Remove(HostWindowId id) {
    WriterMutexLock lock(&mu_);
    Slot* s = LiveSlot(id);
    if (s == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "UnregisterHostWindow(0x%x) on %s: no such window is registered", id,
          device_name_));
    }
    s->live = false;
    free_.push_back(id & kIndexMask);
    return s->window;
  }

  // The window `id`, if [offset, offset + length) lies inside it.
  absl::StatusOr<Window> Find(HostWindowId id, uint64_t offset,
                              uint64_t length) const {
    ReaderMutexLock lock(&mu_);
    const Slot* s = const_cast<HostWindowTable*>(this)->LiveSlot(id);
    if (s == nullptr) {
      return absl::OutOfRangeError(
          absl::StrFormat("DMA fault on %s: host window 0x%x is not registered",
                          device_name_, id));
    }
    if (offset > s->window.length || length > s->window.length - offset) {
      return absl::OutOfRangeError(absl::StrFormat(
          "DMA fault on %s: [%d, +%d) lies outside host window 0x%x of %d "
          "bytes",
          device_name_, offset, length, id, s->window.length));
    }
    return s->window;
  }

  // Calls `fn` on every registered window and unregisters them all.
  void Clear(absl::FunctionRef<void(const Window&)> fn) {
    WriterMutexLock lock(&mu_);
    for (uint32_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].live) continue;
      fn(slots_[i].window);
      slots_[i].live = false;
      free_.push_back(i);
    }
  }

 private:
  static constexpr int kIndexBits = 20;
  static constexpr uint32_t kIndexMask = (1u << kIndexBits) - 1;
  static constexpr uint32_t kGenerationMask = (1u << (32 - kIndexBits)) - 1;

  struct Slot {
    Window window;
    uint32_t generation = 0;
    bool live = false;
  };

  Slot* LiveSlot(HostWindowId id) ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    const uint32_t index = id & kIndexMask;
    if (index >= slots_.size() || !slots_[index].live ||
        slots_[index].generation != (id >> kIndexBits)) {
      return nullptr;
    }
    return &slots_[index];
  }

  const std::string device_name_;
  mutable SharedMutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpushim

#endif  // TPUSHIM_DEVICE_HOST_WINDOW_TABLE_H_
