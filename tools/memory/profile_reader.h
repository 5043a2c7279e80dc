// Reading a TPUSHIM_MEMORY_PROFILE back (transfer/memory_profile.h has its
// format): the device memory over time, per device, for `tpushim memory`.
//
//   absl::StatusOr<ProfileSummary> s = ReadMemoryProfile(text);
//   s->devices[0].peak_padded_bytes;   // the most the device held
//   s->devices[0].at_peak;             // what it held then, largest first
//
// Bytes in use are the padded sizes of the live buffers (what XLA's
// memory viewer calls "heap" size) and their unpadded sizes; the peak is
// the moment the padded bytes were highest (the first such moment).
//
// Malformed input (a line that is not a JSON object, an event without its
// fields, a device that the header does not list, an id allocated twice or
// freed without its allocation) is INVALID_ARGUMENT naming the line. A
// last line cut short (the process died while writing it) is skipped and
// noted, as is a profile without its `end` record.
//
// Pure functions; thread-safe.

#ifndef TPUSHIM_TOOLS_MEMORY_PROFILE_READER_H_
#define TPUSHIM_TOOLS_MEMORY_PROFILE_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpushim::tools {

struct ProfiledBuffer {
  uint64_t id = 0;  // 0 for a failed request
  double t = 0;     // allocated (or refused) at, seconds
  uint64_t device_bytes = 0;
  uint64_t padded_bytes = 0;
  uint64_t unpadded_bytes = 0;
  std::string shape;  // empty for a byte buffer
  std::string label;
  std::string op_metadata;
};

// The device memory after one event.
struct MemorySample {
  double t = 0;
  uint64_t padded_bytes = 0;
  uint64_t unpadded_bytes = 0;
  uint64_t buffers = 0;
};

struct DeviceMemoryProfile {
  std::string name;
  uint64_t hbm_bytes = 0;
  uint64_t granule = 1;
  uint64_t allocations = 0;
  uint64_t frees = 0;
  std::vector<ProfiledBuffer> failed;  // in time order
  // One sample per allocation and free of this device, in time order.
  std::vector<MemorySample> samples;
  // The padded peak: when, how much, and the buffers live then (largest
  // padded first; ties: the older first).
  double peak_t = 0;
  uint64_t peak_padded_bytes = 0;
  uint64_t peak_unpadded_bytes = 0;  // at that moment
  std::vector<ProfiledBuffer> at_peak;
  // The most unpadded bytes at any moment (may be another moment).
  uint64_t max_unpadded_bytes = 0;
  MemorySample end;  // after the last record
};

struct ProfileSummary {
  int64_t pid = 0;
  std::string started;     // RFC 3339, as the header gives it
  double duration = 0;     // the last record's time
  bool complete = false;   // the `end` record is there
  bool cut_short = false;  // the last line was incomplete and skipped
  uint64_t records = 0;    // after the header
  std::vector<DeviceMemoryProfile> devices;
};

absl::StatusOr<ProfileSummary> ReadMemoryProfile(absl::string_view text);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_MEMORY_PROFILE_READER_H_
