// MemoryProfile: the record of device memory that TPUSHIM_MEMORY_PROFILE
// asks for, read back by `tpushim memory`.
//
// The file is JSON Lines, one object per line:
//
//   {"tpushim_memory_profile":1,"pid":4242,
//    "started":"2026-11-26T15:30:00+00:00",
//    "devices":[{"name":"sim:0","hbm_bytes":17179869184,"granule":64}]}
//   {"t":0.000412,"event":"alloc","device":0,"id":1,"device_bytes":512000,
//    "padded_bytes":512000,"unpadded_bytes":40000,
//    "shape":"s32[1000,10]{1,0:T(8,128)}","label":"one_hot"}
//   {"t":0.913,"event":"failed","device":0,"device_bytes":...,...}
//   {"t":1.204,"event":"free","device":0,"id":1}
//   {"t":1.250,"event":"end"}
//
// `t` is seconds since the profile was created (at start-up, before the
// region is premapped). `alloc` carries what
// the buffer is (`shape`, `label` and `op` only when the caller gave them);
// `free` names the id of its `alloc`; `failed` is a device allocation that
// did not fit (the one the HBM report describes). Buffers still live at
// shut-down are freed then and recorded as such, and `end` closes a
// complete profile; a profile without it was cut short (the process died).
//
// Two systems of one process given the same path would truncate and
// interleave one file: the second one's profile goes to "<path>.2" (the
// third's to "<path>.3", ...), with a WARNING naming it; a path is free
// again once its profile is closed.
//
// Records are appended to a buffer under the caller's lock, in the order
// the allocations and frees happened, and written by Flush() — which the
// engine calls after it released its lock — once 64 KiB are pending, at
// once after a failed request (the process may be about to end), and at
// Close(). A failed write is logged once at ERROR and ends the recording;
// the runtime goes on.
//
// Thread-safety: thread-safe.

#ifndef TPUSHIM_TRANSFER_MEMORY_PROFILE_H_
#define TPUSHIM_TRANSFER_MEMORY_PROFILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/mutex.h"
#include "device/device.h"
#include "env/os.h"
#include "nlohmann/json.hpp"

namespace tpushim {

class MemoryProfile {
 public:
  struct DeviceEntry {
    std::string name;
    uint64_t hbm_bytes = 0;
    uint64_t granule = 1;  // the device allocator's rounding
  };
  // One buffer as the records describe it.
  struct Buffer {
    int device = 0;
    uint64_t id = 0;            // unused for a failed request
    uint64_t device_bytes = 0;  // what the device reserves
    uint64_t padded_bytes = 0;
    uint64_t unpadded_bytes = 0;
    absl::string_view shape;  // empty for a byte buffer
    absl::string_view label;
    absl::string_view op_metadata;
  };

  // Creates (or truncates) `path` (or, when another profile of this
  // process has it open, "<path>.N") and writes the header line. The error
  // names the variable and the path.
  static absl::StatusOr<std::unique_ptr<MemoryProfile>> Create(
      const std::string& path, Os* os, int64_t origin_ns,
      const std::vector<DeviceEntry>& devices);
  // The same for open `devices` (their names, HBM and allocator granule),
  // with times counted from now. Whoever starts a transfer engine calls it
  // before the slow work of start-up, so that a path that cannot be
  // created fails at once.
  static absl::StatusOr<std::unique_ptr<MemoryProfile>> ForDevices(
      const std::string& path, Os* os, absl::Span<Device* const> devices);
  ~MemoryProfile();
  MemoryProfile(const MemoryProfile&) = delete;
  MemoryProfile& operator=(const MemoryProfile&) = delete;

  // The file written, which may be "<path>.N".
  const std::string& path() const { return path_; }

  // Append a record stamped now; each returns true when Flush() is due.
  bool Allocated(const Buffer& b);
  bool Freed(int device, uint64_t id);
  bool Failed(const Buffer& b);

  // Writes the pending records, in order.
  void Flush();

  // Appends `end`, writes everything and closes the file. Returns the
  // first write error, if one ended the recording. Idempotent.
  absl::Status Close();

  uint64_t records() const;

 private:
  MemoryProfile(std::string path, Os* os, int64_t origin_ns, int fd);
  // Appends `record` stamped now; `last` closes the profile after it.
  bool Append(const nlohmann::ordered_json& record, bool urgent, bool last);

  const std::string path_;
  Os* const os_;
  const int64_t origin_ns_;

  mutable Mutex mu_;
  std::string pending_ ABSL_GUARDED_BY(mu_);
  uint64_t records_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;

  // Held while writing, so that buffers reach the file in the order they
  // were taken.
  Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int fd_ ABSL_GUARDED_BY(write_mu_) = -1;
  absl::Status write_error_ ABSL_GUARDED_BY(write_mu_);
};

}  // namespace tpushim

#endif  // TPUSHIM_TRANSFER_MEMORY_PROFILE_H_
