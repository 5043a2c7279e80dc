// The pipeline `tpushim demo` (tools/demo/demo.cc) runs: producers fill pinned
// batches, the step loop sends each step's shards to the devices and reads
// the results back, and a verifier checks every byte. Internal to the tool.

#ifndef TPUSHIM_TOOLS_DEMO_PIPELINE_H_
#define TPUSHIM_TOOLS_DEMO_PIPELINE_H_

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/mutex.h"
#include "env/options.h"
#include "logging/log.h"
#include "tools/cli/pseudo_random.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools::demo_internal {

// The defaults of the command line.
constexpr int kDefaultDevices = 4;
constexpr int64_t kDefaultSteps = 20;
constexpr char kDefaultBatchBytes[] = "64M";
constexpr double kDefaultStepMs = 5.0;
constexpr int kDefaultProducers = 2;

// Batches between the producers and the step loop.
constexpr size_t kQueueDepth = 2;
// Device buffers per device and role: step k uses slot k % kSlots.
constexpr int kSlots = 2;
constexpr uint64_t kMinShardBytes = 64;
constexpr uint64_t kMaxBatchBytes = uint64_t{1} << 30;
constexpr size_t kPinnedAlignment = 4096;
// Input-bound when the devices waited for input more than this share of
// the loop's time.
constexpr double kInputBoundShare = 0.10;

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double Seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

// The XXH3 hash of `p[0, n)` rotated left by `r` bytes (p[r..n) p[0..r)),
// without building it.
uint64_t RotatedHash(const uint8_t* p, uint64_t n, uint64_t r);

// ---- Pipeline pieces -------------------------------------------------------

struct DemoConfig {
  int64_t steps = kDefaultSteps;
  uint64_t batch_bytes = 0;
  int devices = 1;
  uint64_t shard_bytes = 0;  // batch_bytes / devices, whole blocks
  // The largest DeviceDescription::block_bytes: shards and rotations are
  // whole device blocks (NVMe devices move whole logical blocks).
  uint64_t block_bytes = 1;
  double step_ms = kDefaultStepMs;
  int producers = kDefaultProducers;
};

// A FIFO between threads: Push blocks while `capacity` items are queued;
// Pop blocks until an item comes or the queue is closed and empty.
template <typename T>
class WorkQueue {
 public:
  explicit WorkQueue(size_t capacity = std::numeric_limits<size_t>::max())
      : capacity_(capacity) {}

  // False (and `item` dropped) when the queue is closed.
  bool Push(T item) {
    MutexLock lock(&mu_);
    while (!closed_ && items_.size() >= capacity_) cv_.Wait(&mu_);
    if (closed_) return false;
    items_.push_back(std::move(item));
    cv_.SignalAll();
    return true;
  }
  // nullopt once the queue is closed and drained.
  std::optional<T> Pop() {
    MutexLock lock(&mu_);
    while (!closed_ && items_.empty()) cv_.Wait(&mu_);
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    cv_.SignalAll();
    return item;
  }
  void Close() {
    MutexLock lock(&mu_);
    closed_ = true;
    cv_.SignalAll();
  }

 private:
  const size_t capacity_;
  Mutex mu_;
  CondVar cv_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// One batch: `batch_bytes` of host memory, shard d at d * shard_bytes.
struct Batch {
  int64_t index = 0;
  bool pinned = false;  // in a PinnedHostBuffer, else pageable
  std::unique_ptr<uint8_t[]> pageable;
  PinnedHostBuffer pinned_buffer;
  uint8_t* data = nullptr;
  // Per shard: the rotation the device applies and the XXH3 hash the
  // result must have.
  std::vector<uint64_t> rotation;
  std::vector<uint64_t> expected_hash;
  absl::Status status;  // not OK: the batch could not be allocated
};

// One shard's journey; written by its device thread before it counts
// itself done (StepWork::devices_left), read by the verifier after.
struct ShardWork {
  absl::StatusOr<Event> up = Event();
  std::optional<Event> down;
  absl::Status status;  // the first failure of this shard's transfers
};

struct StepWork {
  int64_t step = 0;
  int slot = 0;
  std::unique_ptr<Batch> batch;
  std::vector<ShardWork> shards;
  // Guarded by Pipeline::step_mu_.
  int devices_left = 0;
  bool results_back = false;  // every device→host transfer is done
  bool verified = false;      // hashes checked, batch released
};

// What a run measured; filled as it runs, complete after Pipeline::Run.
struct RunCounters {
  int64_t steps_run = 0;   // fewer than configured when interrupted
  int interrupted_by = 0;  // the signal that stopped the loop, else 0
  int64_t loop_ns = 0;
  int64_t producer_wait_ns = 0;  // the step loop waiting for a batch
  // The step loop waiting for earlier steps' results to come back (their
  // device buffers are reused) and for their verification.
  int64_t result_wait_ns = 0;
  std::vector<int64_t> device_wait_ns;     // per device
  std::vector<int64_t> device_compute_ns;  // per device
  std::vector<int64_t> device_result_ns;   // per device: d2d result copies
  uint64_t batches_pageable = 0;
  uint64_t batches_pinned = 0;
  uint64_t fallback_region_full = 0;
  uint64_t fallback_over_threshold = 0;
  uint64_t fallback_region_off = 0;
  uint64_t hash_mismatches = 0;
  uint64_t failed_transfers = 0;
  uint64_t failed_allocations = 0;
  std::string first_error;

  uint64_t errors() const {
    return hash_mismatches + failed_transfers + failed_allocations;
  }
  uint64_t fallbacks() const {
    return fallback_region_full + fallback_over_threshold + fallback_region_off;
  }
};

class Pipeline {
 public:
  Pipeline(System& system, const DemoConfig& config)
      : system_(system), config_(config), batches_(kQueueDepth) {
    counters_.device_wait_ns.assign(config.devices, 0);
    counters_.device_compute_ns.assign(config.devices, 0);
    counters_.device_result_ns.assign(config.devices, 0);
    for (int d = 0; d < config.devices; ++d) {
      device_queues_.push_back(std::make_unique<WorkQueue<StepWork*>>());
    }
  }
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  ~Pipeline() { Stop(); }

  // Allocates the device buffers, runs every step on the calling thread
  // and stops the pipeline's threads. Failures are counted, not returned.
  void Run();

  // Called on the step loop at the start of each step with its number
  // (--shapes allocates the step's activations); a failure is counted as a
  // failed allocation.
  void set_step_hook(absl::AnyInvocable<absl::Status(int64_t)> hook) {
    step_hook_ = std::move(hook);
  }

  RunCounters counters() const {
    MutexLock lock(&counters_mu_);
    return counters_;
  }

 private:
  bool AllocateDeviceBuffers();
  void ReleaseDeviceBuffers();
  void Stop();

  void Producer();
  std::unique_ptr<Batch> MakeBatch(int64_t index);
  void ReleaseBatch(std::unique_ptr<Batch> batch);

  void DeviceLoop(int device);
  absl::Status ProduceResult(int device, StepWork& work, ShardWork& shard);

  void Verifier();
  void WaitFor(const StepWork& work, bool StepWork::*flag);

  void RecordError(uint64_t RunCounters::*counter, absl::string_view what,
                   const absl::Status& status);

  System& system_;
  const DemoConfig config_;
  absl::AnyInvocable<absl::Status(int64_t)> step_hook_;
  int64_t loop_start_ns_ = 0;

  // in_[device][slot] holds the shard; out_[device][slot] the result of
  // the previous device's shard.
  std::vector<std::vector<DeviceBuffer>> in_, out_;

  std::atomic<int64_t> next_batch_{0};
  WorkQueue<std::unique_ptr<Batch>> batches_;
  std::vector<std::unique_ptr<WorkQueue<StepWork*>>> device_queues_;
  WorkQueue<StepWork*> verify_queue_;

  Mutex pool_mu_;
  std::vector<std::unique_ptr<uint8_t[]>> pageable_pool_
      ABSL_GUARDED_BY(pool_mu_);

  Mutex step_mu_;
  CondVar step_cv_;

  mutable Mutex counters_mu_;
  RunCounters counters_ ABSL_GUARDED_BY(counters_mu_);

  std::vector<std::thread> threads_;
};

}  // namespace tpushim::tools::demo_internal

#endif  // TPUSHIM_TOOLS_DEMO_PIPELINE_H_
