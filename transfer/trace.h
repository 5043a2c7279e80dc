// TraceRecorder: the transfer engine's Chrome trace-event JSON
// (TPUSHIM_TRACE_FILE), which opens in Perfetto and chrome://tracing.
//
// Layout:
//  * one process per device ("sim:0"), with one track per DMA queue
//    ("h2d queue", "d2h queue", "d2d queue") holding a slice per
//    descriptor — named after its path and direction, with `bytes`,
//    `path`, `chunk` and `transfer` arguments — and one submit track per
//    queue ("h2d submit") with a 1 ns slice where each descriptor was
//    submitted. Descriptors that run at once (several DMA engines, an
//    NVMe queue) spill into further lanes of the track ("h2d queue 2"),
//    so that no two slices of a track overlap or start together;
//  * a flow arrow from each submit slice to its descriptor's slice. Both
//    ends carry the category of the slices they sit on ("dma") and their
//    pid, tid and timestamp, the binding Chrome DevTools and Perfetto use;
//  * a "host" process with the counter "staging bytes in flight".
//
// Records are kept in memory (a few dozen bytes each) and written when the
// engine shuts down, to `<path>.tmp.<pid>` first and then renamed, so a
// reader never sees half a file. At most `max_records` are kept; the rest
// are counted and the file says how many were dropped.
//
// Thread-safety: thread-safe; recording takes one short mutex.

#ifndef TPUSHIM_TRANSFER_TRACE_H_
#define TPUSHIM_TRANSFER_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "env/os.h"

namespace tpushim {

class TraceRecorder {
 public:
  // Timestamps are Os::MonotonicNanos; the trace starts at `origin_ns`.
  TraceRecorder(std::string path, Os* os, int64_t origin_ns,
                size_t max_records = size_t{1} << 21);
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  const std::string& path() const { return path_; }

  // Names a device's process (pid = device + 1).
  void NameDevice(int device, const std::string& name);

  // One executed descriptor: submitted at `submit_ns`, ran on the device
  // from `start_ns` to `end_ns`. `path` and `direction` are static strings
  // ("staged", "h2d"). `failed` marks a descriptor that completed with an
  // error.
  void Descriptor(int device, int direction, const char* path,
                  const char* direction_name, uint64_t transfer, uint32_t chunk,
                  uint64_t bytes, int64_t submit_ns, int64_t start_ns,
                  int64_t end_ns, bool failed);

  // The staging counter took value `bytes` at `ns`.
  void StagingBytes(int64_t ns, uint64_t bytes);

  // Writes the file. Returns the Os error if it cannot.
  absl::Status Write();

  uint64_t recorded() const;
  uint64_t dropped() const;

 private:
  struct Record {
    enum class Kind : uint8_t { kDescriptor, kCounter } kind;
    bool failed = false;
    int8_t direction = 0;
    int32_t device = 0;
    uint32_t chunk = 0;
    const char* path = nullptr;
    const char* direction_name = nullptr;
    uint64_t transfer = 0;
    uint64_t bytes = 0;
    int64_t submit_ns = 0;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
  };
  bool Add(const Record& r);

  const std::string path_;
  Os* const os_;
  const int64_t origin_ns_;
  const size_t max_records_;

  mutable Mutex mu_;
  std::vector<Record> records_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> device_names_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tpushim

#endif  // TPUSHIM_TRANSFER_TRACE_H_
