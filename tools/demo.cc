#include "tools/demo.h"

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
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/human_bytes.h"
#include "common/mutex.h"
#include "env/device_url.h"
#include "env/options.h"
#include "logging/log.h"
#include "nlohmann/json.hpp"
#include "tools/pseudo_random.h"
#include "tools/text_table.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kDemoDescription[] =
    "Run an input-pipeline loop like a training job and verify every byte";

constexpr char kDemoFooter[] = R"footer(
Brings the runtime up from the environment exactly as a framework would
(TPU_PREMAPPED_BUFFER_SIZE, TPUSHIM_DEVICE, TPU_LOG_DIR, ...; default
device sim://?devices=4), then runs --steps steps: producer threads fill
batches alternately in pageable memory and in pinned host buffers from the
premapped region, each batch is split across the devices and transferred
host->device, each device waits for its shard and computes for --step-ms,
its result (the shard rotated, written device->device) comes back
device->host and is hash-verified (XXH3). The summary shows start-up time,
throughput per direction and path, staging waits, fallbacks, errors, where
the logs are, and whether the run was input-bound: whether the devices
waited for input more than 10% of the time.

--devices sets only the devices= parameter of TPUSHIM_DEVICE (its other
parameters are kept); --steps 0 only brings the system up and down.

Exit status: 0 when every byte verified and nothing failed; 1 when a
transfer, an allocation or a hash check failed (the summary is still
printed) or the runtime cannot start; 2 for an invalid configuration or
command line.

Examples:
  tpushim demo
  tpushim demo --steps 100 --batch-bytes 16M --step-ms 20
  TPUSHIM_DEVICE='sim://?link_gbps=25&latency_us=2' tpushim demo --devices 2
  TPU_PREMAPPED_BUFFER_SIZE=0 tpushim demo       # no region: staged/pinned
  tpushim demo --steps 0                         # start-up only
  tpushim demo --json | jq '{input_bound, errors, h2d: .transfers.h2d}')footer";

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

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

// ---- Data ------------------------------------------------------------------

// The XXH3 hash of `p[0, n)` rotated left by `r` bytes (p[r..n) p[0..r)),
// without building it.
uint64_t RotatedHash(const uint8_t* p, uint64_t n, uint64_t r) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(
      XXH3_createState(), &XXH3_freeState);
  if (state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state.get());
  XXH3_64bits_update(state.get(), p + r, n - r);
  XXH3_64bits_update(state.get(), p, r);
  return XXH3_64bits_digest(state.get());
}

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
  int64_t loop_ns = 0;
  int64_t producer_wait_ns = 0;  // the step loop waiting for a batch
  // The step loop waiting for earlier steps' results to come back (their
  // device buffers are reused) and for their verification.
  int64_t result_wait_ns = 0;
  std::vector<int64_t> device_wait_ns;      // per device
  std::vector<int64_t> device_compute_ns;   // per device
  std::vector<int64_t> device_result_ns;    // per device: d2d result copies
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
    return fallback_region_full + fallback_over_threshold +
           fallback_region_off;
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

void Pipeline::RecordError(uint64_t RunCounters::*counter,
                           absl::string_view what,
                           const absl::Status& status) {
  LOG(ERROR) << "tpushim demo: " << what << ": " << status;
  MutexLock lock(&counters_mu_);
  ++(counters_.*counter);
  if (counters_.first_error.empty()) {
    counters_.first_error = absl::StrCat(what, ": ", status.ToString());
  }
}

bool Pipeline::AllocateDeviceBuffers() {
  in_.assign(config_.devices, {});
  out_.assign(config_.devices, {});
  for (int d = 0; d < config_.devices; ++d) {
    for (int slot = 0; slot < kSlots; ++slot) {
      for (auto* role : {&in_, &out_}) {
        absl::StatusOr<DeviceBuffer> b =
            system_.AllocateDevice(d, config_.shard_bytes);
        if (!b.ok()) {
          RecordError(&RunCounters::failed_allocations,
                      absl::StrCat("device buffer on device ", d), b.status());
          return false;
        }
        (*role)[d].push_back(*std::move(b));
      }
    }
  }
  return true;
}

void Pipeline::ReleaseDeviceBuffers() {
  std::vector<Event> freed;
  for (auto* role : {&in_, &out_}) {
    for (std::vector<DeviceBuffer>& buffers : *role) {
      for (const DeviceBuffer& b : buffers) {
        absl::StatusOr<Event> e = system_.Deallocate(b);
        if (e.ok()) freed.push_back(*std::move(e));
      }
    }
  }
  for (const Event& e : freed) (void)e.Await();
  in_.clear();
  out_.clear();
}

void Pipeline::Stop() {
  batches_.Close();
  for (auto& q : device_queues_) q->Close();
  verify_queue_.Close();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

// ---- Producers ---------------------------------------------------------------

std::unique_ptr<Batch> Pipeline::MakeBatch(int64_t index) {
  auto batch = std::make_unique<Batch>();
  batch->index = index;
  const uint64_t size = config_.batch_bytes;
  // Odd batches go in pinned host buffers from the premapped region.
  if (index % 2 == 1) {
    uint64_t RunCounters::*fallback = nullptr;
    if (system_.premapped_bytes() == 0) {
      fallback = &RunCounters::fallback_region_off;
    } else if (size > system_.transfer_threshold_bytes()) {
      // The region serves nothing larger (and would log an ERROR for it).
      fallback = &RunCounters::fallback_over_threshold;
    } else {
      absl::StatusOr<PinnedHostBuffer> b =
          system_.AllocatePinnedHost(size, kPinnedAlignment);
      if (b.ok()) {
        batch->pinned = true;
        batch->pinned_buffer = *std::move(b);
        batch->data = static_cast<uint8_t*>(batch->pinned_buffer.data());
      } else if (absl::IsResourceExhausted(b.status())) {
        fallback = &RunCounters::fallback_region_full;
      } else if (absl::IsFailedPrecondition(b.status())) {
        fallback = &RunCounters::fallback_region_off;
      } else {
        RecordError(&RunCounters::failed_allocations,
                    absl::StrCat("pinned host buffer for batch ", index),
                    b.status());
      }
    }
    if (fallback != nullptr) {
      MutexLock lock(&counters_mu_);
      ++(counters_.*fallback);
    }
  }
  if (!batch->pinned) {
    {
      MutexLock lock(&pool_mu_);
      if (!pageable_pool_.empty()) {
        batch->pageable = std::move(pageable_pool_.back());
        pageable_pool_.pop_back();
      }
    }
    if (batch->pageable == nullptr) {
      try {
        batch->pageable = std::make_unique_for_overwrite<uint8_t[]>(size);
      } catch (const std::bad_alloc&) {
        batch->status = absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate a pageable batch of ", HumanReadableBytes(size)));
        RecordError(&RunCounters::failed_allocations,
                    absl::StrCat("pageable batch ", index), batch->status);
        return batch;
      }
    }
    batch->data = batch->pageable.get();
  }
  {
    MutexLock lock(&counters_mu_);
    ++(batch->pinned ? counters_.batches_pinned : counters_.batches_pageable);
  }

  FillPseudoRandom(batch->data, size, static_cast<uint64_t>(index) + 1);
  const uint64_t n = config_.shard_bytes;
  const uint64_t blocks = n / config_.block_bytes;
  for (int d = 0; d < config_.devices; ++d) {
    // 1 .. blocks-1 blocks, different per batch and device (0 when the
    // shard is a single block).
    const uint64_t r =
        blocks < 2
            ? 0
            : config_.block_bytes *
                  (1 + (static_cast<uint64_t>(index) * 7919 +
                        static_cast<uint64_t>(d) * 104729) %
                           (blocks - 1));
    batch->rotation.push_back(r);
    batch->expected_hash.push_back(RotatedHash(batch->data + d * n, n, r));
  }
  return batch;
}

void Pipeline::ReleaseBatch(std::unique_ptr<Batch> batch) {
  if (batch->pageable != nullptr) {
    MutexLock lock(&pool_mu_);
    pageable_pool_.push_back(std::move(batch->pageable));
  }
  batch->pinned_buffer.Reset();
}

void Pipeline::Producer() {
  while (true) {
    const int64_t index = next_batch_.fetch_add(1);
    if (index >= config_.steps) return;
    if (!batches_.Push(MakeBatch(index))) return;
  }
}

// ---- Devices -----------------------------------------------------------------

absl::Status Pipeline::ProduceResult(int device, StepWork& work,
                                     ShardWork& shard) {
  const uint64_t n = config_.shard_bytes;
  const uint64_t r = work.batch->rotation[device];
  const DeviceBuffer& src = in_[device][work.slot];
  const DeviceBuffer& dst = out_[(device + 1) % config_.devices][work.slot];
  // The result: the shard rotated left by r, on the next device.
  absl::StatusOr<Event> head =
      system_.TransferDeviceToDevice(src, r, dst, 0, n - r);
  // A shard of one device block is not rotated: it has no tail.
  std::optional<absl::StatusOr<Event>> tail;
  if (r > 0) tail = system_.TransferDeviceToDevice(src, 0, dst, n - r, r);
  const absl::Status head_status = head.ok() ? head->Await() : head.status();
  const absl::Status tail_status =
      !tail.has_value() ? absl::OkStatus()
                        : (tail->ok() ? (*tail)->Await() : tail->status());
  if (!head_status.ok()) return head_status;
  if (!tail_status.ok()) return tail_status;
  absl::StatusOr<Event> down = system_.TransferFromDevice(
      dst, 0, work.batch->data + device * n, n);
  if (!down.ok()) return down.status();
  shard.down = *std::move(down);
  return absl::OkStatus();
}

void Pipeline::DeviceLoop(int device) {
  int64_t free_ns = loop_start_ns_;  // when the device last became idle
  int64_t wait_ns = 0;
  int64_t compute_ns = 0;
  int64_t result_ns = 0;
  const absl::Duration step = absl::Microseconds(config_.step_ms * 1000.0);
  while (std::optional<StepWork*> item = device_queues_[device]->Pop()) {
    StepWork& work = **item;
    ShardWork& shard = work.shards[device];
    absl::Status status = shard.up.ok() ? shard.up->Await() : shard.up.status();
    const int64_t ready_ns = NowNs();
    wait_ns += std::max<int64_t>(0, ready_ns - free_ns);
    if (status.ok()) {
      if (step > absl::ZeroDuration()) absl::SleepFor(step);
      const int64_t compute_end_ns = NowNs();
      compute_ns += compute_end_ns - ready_ns;
      status = ProduceResult(device, work, shard);
      result_ns += NowNs() - compute_end_ns;
    }
    shard.status = status;
    {
      MutexLock lock(&step_mu_);
      --work.devices_left;
      step_cv_.SignalAll();
    }
    free_ns = NowNs();
  }
  MutexLock lock(&counters_mu_);
  counters_.device_wait_ns[device] = wait_ns;
  counters_.device_compute_ns[device] = compute_ns;
  counters_.device_result_ns[device] = result_ns;
}

// ---- Verifier ----------------------------------------------------------------

void Pipeline::WaitFor(const StepWork& work, bool StepWork::*flag) {
  MutexLock lock(&step_mu_);
  while (!(work.*flag)) step_cv_.Wait(&step_mu_);
}

void Pipeline::Verifier() {
  while (std::optional<StepWork*> item = verify_queue_.Pop()) {
    StepWork& work = **item;
    {
      MutexLock lock(&step_mu_);
      while (work.devices_left > 0) step_cv_.Wait(&step_mu_);
    }
    for (ShardWork& shard : work.shards) {
      if (shard.status.ok() && shard.down.has_value()) {
        shard.status = shard.down->Await();
      }
    }
    {
      MutexLock lock(&step_mu_);
      work.results_back = true;
      step_cv_.SignalAll();
    }
    const Batch& batch = *work.batch;
    const uint64_t n = config_.shard_bytes;
    for (int d = 0; d < static_cast<int>(work.shards.size()); ++d) {
      const std::string what =
          absl::StrCat("step ", work.step, " (batch ", batch.index,
                       batch.pinned ? ", pinned" : ", pageable", ") device ",
                       d);
      if (!work.shards[d].status.ok()) {
        RecordError(&RunCounters::failed_transfers, what,
                    work.shards[d].status);
        continue;
      }
      const uint64_t hash = XXH3_64bits(batch.data + d * n, n);
      if (hash != batch.expected_hash[d]) {
        RecordError(&RunCounters::hash_mismatches, what,
                    absl::DataLossError(absl::StrFormat(
                        "result hash %016x, expected %016x", hash,
                        batch.expected_hash[d])));
      }
    }
    ReleaseBatch(std::move(work.batch));
    MutexLock lock(&step_mu_);
    work.verified = true;
    step_cv_.SignalAll();
  }
}

// ---- The step loop -----------------------------------------------------------

void Pipeline::Run() {
  if (!AllocateDeviceBuffers()) {
    ReleaseDeviceBuffers();
    return;
  }
  loop_start_ns_ = NowNs();
  for (int p = 0; p < config_.producers; ++p) {
    threads_.emplace_back([this] { Producer(); });
  }
  for (int d = 0; d < config_.devices; ++d) {
    threads_.emplace_back([this, d] { DeviceLoop(d); });
  }
  threads_.emplace_back([this] { Verifier(); });

  int64_t producer_wait_ns = 0;
  int64_t result_wait_ns = 0;
  std::deque<std::unique_ptr<StepWork>> in_flight;  // oldest first
  for (int64_t k = 0; k < config_.steps; ++k) {
    // Slot k % 2 is free once step k-2's results are back; at most three
    // steps are unverified (which bounds the batches alive).
    const int64_t result_wait_start = NowNs();
    if (in_flight.size() >= kSlots) {
      WaitFor(*in_flight[in_flight.size() - kSlots], &StepWork::results_back);
    }
    if (in_flight.size() > kSlots) {
      WaitFor(*in_flight.front(), &StepWork::verified);
      in_flight.pop_front();
    }
    const int64_t wait_start = NowNs();
    result_wait_ns += wait_start - result_wait_start;
    std::optional<std::unique_ptr<Batch>> batch = batches_.Pop();
    producer_wait_ns += NowNs() - wait_start;
    if (!batch.has_value()) break;  // cannot happen: producers make them all

    auto work = std::make_unique<StepWork>();
    work->step = k;
    work->slot = static_cast<int>(k % kSlots);
    work->batch = *std::move(batch);
    if (work->batch->status.ok()) {
      work->shards.resize(config_.devices);
      work->devices_left = config_.devices;
      const uint64_t n = config_.shard_bytes;
      for (int d = 0; d < config_.devices; ++d) {
        work->shards[d].up = system_.TransferToDevice(
            work->batch->data + d * n, in_[d][work->slot], 0, n);
      }
      for (int d = 0; d < config_.devices; ++d) {
        device_queues_[d]->Push(work.get());
      }
    }
    verify_queue_.Push(work.get());
    in_flight.push_back(std::move(work));
  }
  for (const auto& work : in_flight) WaitFor(*work, &StepWork::verified);
  const int64_t loop_end = NowNs();
  Stop();
  ReleaseDeviceBuffers();

  MutexLock lock(&counters_mu_);
  counters_.loop_ns = loop_end - loop_start_ns_;
  counters_.producer_wait_ns = producer_wait_ns;
  counters_.result_wait_ns = result_wait_ns;
}

// ---- The summary -------------------------------------------------------------

struct Summary {
  DemoConfig config;
  std::string device_url;
  double init_seconds = 0;
  uint64_t premapped_bytes = 0;
  uint64_t threshold_bytes = 0;
  RegionStats region;
  std::vector<DeviceDescription> devices;
  RunCounters run;
  TransferStats transfers;
  std::string log_directory;

  // Mean over devices.
  double DeviceWaitSeconds() const { return Mean(run.device_wait_ns); }
  double ComputeSeconds() const { return Mean(run.device_compute_ns); }
  double ResultSeconds() const { return Mean(run.device_result_ns); }
  double LoopSeconds() const { return Seconds(run.loop_ns); }
  double Share(double seconds) const {
    return run.loop_ns > 0 ? seconds / LoopSeconds() : 0.0;
  }
  double InputWaitShare() const { return Share(DeviceWaitSeconds()); }
  bool InputBound() const {
    return config.steps > 0 && InputWaitShare() > kInputBoundShare;
  }
  uint64_t BytesMoved(int direction) const {
    uint64_t bytes = 0;
    for (const PathStats& p : transfers.host[direction]) bytes += p.bytes;
    return bytes;
  }
  std::string InfoFile() const {
    return log_directory.empty() ? "" : log_directory + "/tpu_driver.INFO";
  }

  // One sentence on whether the run was input-bound and why.
  std::string InputBoundReason() const {
    if (config.steps == 0 || run.loop_ns == 0) {
      return "input-bound: n/a (no steps ran).";
    }
    const double share = InputWaitShare();
    if (!InputBound()) {
      return absl::StrFormat(
          "input-bound: no (the devices waited for input %.0f%% of the run, "
          "within the %.0f%% bound); the modelled device step (--step-ms) "
          "set the pace.",
          share * 100, kInputBoundShare * 100);
    }
    // Attribute the devices' wait to what the step loop waited for: a
    // batch from the producers, earlier results coming back (their device
    // buffers are reused), or else the host-to-device transfers.
    const double producers = Seconds(run.producer_wait_ns);
    const double results = Seconds(run.result_wait_ns);
    const double uploads =
        std::max(0.0, DeviceWaitSeconds() - producers - results);
    absl::string_view cause;
    if (producers >= results && producers >= uploads) {
      cause =
          "mostly for the producers to fill batches; more producer threads "
          "(--producers) or cheaper preprocessing would help";
    } else if (results >= uploads) {
      cause =
          "mostly for earlier results to come back device-to-host before "
          "their buffers could be reused; a longer --step-ms or smaller "
          "batches would hide it";
    } else {
      cause =
          "mostly for host-to-device transfers; pinned (premapped) host "
          "buffers, which take the zero-copy path, would help";
    }
    return absl::StrFormat(
        "input-bound: yes (the devices waited for input %.0f%% of the run, "
        "above the %.0f%% bound), %s.",
        share * 100, kInputBoundShare * 100, cause);
  }

 private:
  static double Mean(const std::vector<int64_t>& ns) {
    if (ns.empty()) return 0.0;
    int64_t sum = 0;
    for (int64_t v : ns) sum += v;
    return Seconds(sum) / static_cast<double>(ns.size());
  }
};

constexpr DmaDirection kHostDirections[] = {DmaDirection::kHostToDevice,
                                            DmaDirection::kDeviceToHost};
constexpr TransferPath kPaths[] = {TransferPath::kZeroCopy,
                                   TransferPath::kStaged,
                                   TransferPath::kPinned};

std::optional<double> Gbps(const PathStats& p) {
  if (p.active_ns <= 0 || p.bytes == 0) return std::nullopt;
  return static_cast<double>(p.bytes) / static_cast<double>(p.active_ns);
}

Json PathJson(const PathStats& p) {
  const std::optional<double> gbps = Gbps(p);
  return {{"transfers", p.transfers},
          {"bytes", p.bytes},
          {"failed", p.failed},
          {"busy_seconds", Seconds(p.busy_ns)},
          {"active_seconds", Seconds(p.active_ns)},
          {"gbps", gbps.has_value() ? Json(*gbps) : Json(nullptr)}};
}

Json SummaryJson(const Summary& s) {
  Json transfers = Json::object();
  for (DmaDirection dir : kHostDirections) {
    Json paths = Json::object();
    for (TransferPath path : kPaths) {
      paths[std::string(TransferPathName(path))] = PathJson(
          s.transfers.host[static_cast<int>(dir)][static_cast<int>(path)]);
    }
    transfers[std::string(DmaDirectionName(dir))] = paths;
  }
  transfers[std::string(DmaDirectionName(DmaDirection::kDeviceToDevice))] =
      PathJson(s.transfers.device_to_device);
  const RunCounters& run = s.run;
  const double steps = static_cast<double>(std::max<int64_t>(s.config.steps, 1));
  return {
      {"init_seconds", s.init_seconds},
      {"premapped_bytes", s.premapped_bytes},
      {"threshold_bytes", s.threshold_bytes},
      {"device", s.device_url},
      {"devices", s.config.devices},
      {"steps", s.config.steps},
      {"batch_bytes", s.config.batch_bytes},
      {"shard_bytes", s.config.shard_bytes},
      {"step_ms", s.config.step_ms},
      {"producers", s.config.producers},
      {"loop_seconds", s.LoopSeconds()},
      {"step_seconds", s.config.steps > 0 ? s.LoopSeconds() / steps : 0.0},
      {"batches",
       {{"pageable", run.batches_pageable}, {"pinned", run.batches_pinned}}},
      {"bytes_moved",
       {{"h2d", s.BytesMoved(0)},
        {"d2h", s.BytesMoved(1)},
        {"d2d", s.transfers.device_to_device.bytes}}},
      {"transfers", transfers},
      {"staging",
       {{"waits", s.transfers.staging_waits},
        {"wait_seconds", Seconds(s.transfers.staging_wait_ns)},
        {"peak_bytes", s.transfers.peak_staging_bytes},
        {"max_bytes", s.transfers.max_staging_bytes}}},
      {"pinned_transfers",
       {{"over_threshold", s.transfers.pinned_over_threshold},
        {"region_off", s.transfers.pinned_region_off},
        {"staging_timeout", s.transfers.pinned_staging_timeout}}},
      {"pinned_host_fallbacks",
       {{"total", run.fallbacks()},
        {"region_full", run.fallback_region_full},
        {"over_threshold", run.fallback_over_threshold},
        {"region_off", run.fallback_region_off}}},
      {"input",
       {{"device_wait_seconds", s.DeviceWaitSeconds()},
        {"producer_wait_seconds", Seconds(run.producer_wait_ns)},
        {"result_wait_seconds", Seconds(run.result_wait_ns)},
        {"compute_seconds", s.ComputeSeconds()},
        {"result_copy_seconds", s.ResultSeconds()},
        {"device_wait_share", s.InputWaitShare()},
        {"producer_wait_share", s.Share(Seconds(run.producer_wait_ns))},
        {"result_wait_share", s.Share(Seconds(run.result_wait_ns))}}},
      {"input_bound", s.InputBound()},
      {"input_wait_share", s.InputWaitShare()},
      {"input_bound_threshold", kInputBoundShare},
      {"input_bound_reason", s.InputBoundReason()},
      {"errors", run.errors()},
      {"error_detail",
       {{"hash_mismatches", run.hash_mismatches},
        {"failed_transfers", run.failed_transfers},
        {"failed_allocations", run.failed_allocations},
        {"first_error", run.first_error.empty() ? Json(nullptr)
                                                : Json(run.first_error)}}},
      {"logs",
       {{"directory", s.log_directory.empty() ? Json(nullptr)
                                              : Json(s.log_directory)},
        {"info_file",
         s.log_directory.empty() ? Json(nullptr) : Json(s.InfoFile())}}},
  };
}

std::string Ms(double seconds) {
  return absl::StrFormat("%.1f ms", seconds * 1e3);
}
std::string Percent(double share) {
  return absl::StrFormat("%.0f%%", share * 100);
}

// The run, the transfers and the input waits (when steps ran).
void PrintRun(const Summary& s, std::ostream& out) {
  const RunCounters& run = s.run;
  const DemoConfig& c = s.config;
  {
    out << "\nRun\n";
    TextTable table;
    table.AddRow(
        {"loop time",
         absl::StrFormat("%.3f s (%s per step)", s.LoopSeconds(),
                         Ms(s.LoopSeconds() / static_cast<double>(c.steps)))});
    table.AddRow({"batches", absl::StrCat(run.batches_pageable, " pageable, ",
                                          run.batches_pinned,
                                          " in pinned host buffers")});
    table.AddRow(
        {"pinned-host fallbacks",
         absl::StrCat(run.fallbacks(), " to pageable (", run.fallback_region_full,
                      " region full, ", run.fallback_over_threshold,
                      " above the threshold, ", run.fallback_region_off,
                      " region off)")});
    const uint64_t h2d = s.BytesMoved(0), d2h = s.BytesMoved(1),
                   d2d = s.transfers.device_to_device.bytes;
    table.AddRow(
        {"bytes moved",
         absl::StrFormat("%s h2d, %s d2h, %s d2d (%.2f GB/s over the loop)",
                         HumanReadableBytes(h2d), HumanReadableBytes(d2h),
                         HumanReadableBytes(d2d),
                         s.LoopSeconds() > 0
                             ? static_cast<double>(h2d + d2h + d2d) * 1e-9 /
                                   s.LoopSeconds()
                             : 0.0)});
    table.Print(out);
  }

  out << "\nTransfers (GB/s: the mean rate of one transfer once started, bytes\n"
         "over summed start-to-ready time)\n";
  TextTable transfers(
      {"DIRECTION", "PATH", "TRANSFERS", "BYTES", "FAILED", "GB/s"});
  auto add = [&transfers](absl::string_view dir, absl::string_view path,
                          const PathStats& p) {
    const std::optional<double> gbps = Gbps(p);
    transfers.AddRow({std::string(dir), std::string(path),
                      absl::StrCat(p.transfers), HumanReadableBytes(p.bytes),
                      absl::StrCat(p.failed),
                      gbps.has_value() ? absl::StrFormat("%.2f", *gbps) : "-"});
  };
  for (DmaDirection dir : kHostDirections) {
    for (TransferPath path : kPaths) {
      add(DmaDirectionName(dir), TransferPathName(path),
          s.transfers.host[static_cast<int>(dir)][static_cast<int>(path)]);
    }
  }
  add(DmaDirectionName(DmaDirection::kDeviceToDevice), "-",
      s.transfers.device_to_device);
  transfers.Print(out);
  TextTable staging;
  staging.AddRow(
      {"staging waits",
       absl::StrCat(s.transfers.staging_waits, " (",
                    Ms(Seconds(s.transfers.staging_wait_ns)), " in total), peak ",
                    HumanReadableBytes(s.transfers.peak_staging_bytes), " of ",
                    HumanReadableBytes(s.transfers.max_staging_bytes))});
  staging.AddRow(
      {"pinned transfers",
       absl::StrCat(s.transfers.pinned_over_threshold, " above the threshold, ",
                    s.transfers.pinned_region_off, " region off, ",
                    s.transfers.pinned_staging_timeout, " staging timeout")});
  staging.Print(out);

  {
    const double steps = static_cast<double>(c.steps);
    out << "\nInput (per step; device times are means over the devices)\n";
    TextTable input;
    input.AddRow({"device input wait",
                  absl::StrCat(Ms(s.DeviceWaitSeconds() / steps), " (",
                               Percent(s.InputWaitShare()), " of the run)")});
    input.AddRow({"device compute", Ms(s.ComputeSeconds() / steps)});
    input.AddRow({"device result copies (d2d)", Ms(s.ResultSeconds() / steps)});
    input.AddRow(
        {"loop waiting for producers",
         absl::StrCat(Ms(Seconds(run.producer_wait_ns) / steps), " (",
                      Percent(s.Share(Seconds(run.producer_wait_ns))),
                      " of the run)")});
    input.AddRow(
        {"loop waiting for results",
         absl::StrCat(Ms(Seconds(run.result_wait_ns) / steps), " (",
                      Percent(s.Share(Seconds(run.result_wait_ns))),
                      " of the run)")});
    input.Print(out);
  }
}

void PrintSummary(const Summary& s, std::ostream& out) {
  const RunCounters& run = s.run;
  const DemoConfig& c = s.config;
  if (c.steps == 0) {
    out << "tpushim demo: start-up and shut-down only (--steps 0)\n";
  } else {
    out << "tpushim demo: " << c.steps << " steps, batch "
        << HumanReadableBytes(c.batch_bytes) << " = " << c.devices << " x "
        << HumanReadableBytes(c.shard_bytes) << ", "
        << absl::StrFormat("%g", c.step_ms) << " ms modelled step, "
        << c.producers << " producers\n";
  }

  out << "\nStart-up\n";
  TextTable startup;
  startup.AddRow({"init time", absl::StrFormat("%.3f s", s.init_seconds)});
  if (s.premapped_bytes == 0) {
    startup.AddRow({"premapped region", "off (TPU_PREMAPPED_BUFFER_SIZE=0)"});
  } else {
    startup.AddRow(
        {"premapped region",
         absl::StrCat(BytesWithHumanReadable(s.premapped_bytes), ", ",
                      s.region.page_kind, " pages",
                      s.region.locked ? ", mlocked" : ", not mlocked",
                      ", NUMA node ", s.region.numa_node)});
    startup.AddRow(
        {"transfer threshold", BytesWithHumanReadable(s.threshold_bytes)});
  }
  startup.AddRow({"devices", absl::StrCat(c.devices, " (", s.device_url, ")")});
  if (!s.devices.empty()) {
    const DeviceDescription& d = s.devices.front();
    startup.AddRow(
        {"device HBM, link",
         absl::StrCat(HumanReadableBytes(d.hbm_bytes), ", ",
                      d.link_gbps > 0 ? absl::StrFormat("%g Gb/s", d.link_gbps)
                                      : std::string("unthrottled"),
                      ", ", absl::StrFormat("%g", d.latency_us),
                      " us latency, ", d.dma_engines, " DMA engine(s)")});
  }
  startup.Print(out);
  if (c.steps > 0 && run.loop_ns > 0) PrintRun(s, out);
  out << "\n" << s.InputBoundReason() << "\n";

  out << "\nErrors\n";
  TextTable errors;
  errors.AddRow({"hash mismatches", absl::StrCat(run.hash_mismatches)});
  errors.AddRow({"failed transfers", absl::StrCat(run.failed_transfers)});
  errors.AddRow({"failed allocations", absl::StrCat(run.failed_allocations)});
  if (!run.first_error.empty()) errors.AddRow({"first", run.first_error});
  errors.Print(out);

  out << "\nLogs: "
      << (s.log_directory.empty() ? "none (TPU_LOG_DIR=disabled or unusable)"
                                  : s.InfoFile())
      << "\n";
  out << "errors = " << run.errors() << "\n";
}

// ---- The command -------------------------------------------------------------

struct DemoFlags {
  int64_t steps = kDefaultSteps;
  std::string batch_bytes = kDefaultBatchBytes;
  int devices = 0;
  bool devices_given = false;
  double step_ms = kDefaultStepMs;
  int producers = kDefaultProducers;
  bool json = false;
};

void RunDemo(const DemoFlags& flags, CommandContext& context) {
  absl::StatusOr<Options> options = ResolveOptions(*context.os);
  if (!options.ok()) {
    ReportError(options.status(), "invalid configuration", flags.json,
                kExitUsage, context);
    return;
  }
  DemoConfig config;
  config.steps = flags.steps;
  config.step_ms = flags.step_ms;
  config.producers = flags.producers;
  // Validated by the option's check.
  config.batch_bytes =
      ParseByteSize(flags.batch_bytes, "--batch-bytes").value_or(0);

  // The device URL: TPUSHIM_DEVICE, or sim://?devices=4; --devices sets
  // only its devices= parameter.
  OptionOverrides overrides;
  const Option<DeviceUrl>& device = options->device;
  std::string url = device.value.text;
  config.devices = device.value.devices;
  if (device.source == OptionSource::kDefault) {
    config.devices = flags.devices_given ? flags.devices : kDefaultDevices;
    url = absl::StrCat("sim://?devices=", config.devices);
    overrides.device = url;
  } else if (flags.devices_given) {
    config.devices = flags.devices;
    url = WithUrlParameter(url, "devices", absl::StrCat(config.devices));
    overrides.device = url;
  }
  config.shard_bytes = config.batch_bytes / config.devices;
  if (config.shard_bytes < kMinShardBytes) {
    ReportError(absl::InvalidArgumentError(absl::StrCat(
                    "--batch-bytes=", flags.batch_bytes, " gives ",
                    config.shard_bytes, " bytes per device on ",
                    config.devices, " devices; at least ", kMinShardBytes,
                    " are needed")),
                "invalid command line", flags.json, kExitUsage, context);
    return;
  }
  config.batch_bytes = config.shard_bytes * config.devices;

  absl::StatusOr<std::unique_ptr<System>> system = System::Create(overrides);
  if (!system.ok()) {
    const bool invalid = absl::IsInvalidArgument(system.status());
    ReportError(system.status(),
                invalid ? "invalid configuration" : "cannot start the runtime",
                flags.json, invalid ? kExitUsage : kExitFailure, context);
    return;
  }
  config.devices = (*system)->device_count();
  for (int d = 0; d < config.devices; ++d) {
    config.block_bytes = std::max<uint64_t>(config.block_bytes,
                                            (*system)->device(d).block_bytes);
  }
  config.shard_bytes = std::max(
      config.block_bytes,
      config.batch_bytes / config.devices / config.block_bytes *
          config.block_bytes);
  config.batch_bytes = config.shard_bytes * config.devices;
  Summary summary;
  summary.config = config;
  summary.device_url = url;
  summary.init_seconds = absl::ToDoubleSeconds((*system)->init_time());
  summary.premapped_bytes = (*system)->premapped_bytes();
  summary.threshold_bytes = (*system)->transfer_threshold_bytes();
  for (int d = 0; d < (*system)->device_count(); ++d) {
    summary.devices.push_back((*system)->device(d));
  }
  summary.log_directory = (*system)->log_directory();

  if (config.steps > 0) {
    LOG(INFO) << "tpushim demo: " << config.steps << " steps of "
              << config.batch_bytes << " bytes on " << config.devices
              << " devices, " << config.step_ms << " ms per step, "
              << config.producers << " producers";
    Pipeline pipeline(**system, config);
    pipeline.Run();
    summary.run = pipeline.counters();
  }
  const SystemStats stats = (*system)->GetStats();
  summary.region = stats.region;
  summary.transfers = stats.transfers;
  LOG(INFO) << "tpushim demo: done: " << summary.run.errors() << " errors, "
            << (summary.InputBound() ? "input-bound" : "not input-bound");
  system->reset();  // everything released before the summary is written

  if (flags.json) {
    WriteJson(SummaryJson(summary), *context.out);
  } else {
    PrintSummary(summary, *context.out);
  }
  context.exit_code = summary.run.errors() == 0 ? kExitOk : kExitFailure;
}

}  // namespace

void RegisterDemoCommand(CLI::App& app, CommandContext& context) {
  CLI::App* demo = app.add_subcommand("demo", kDemoDescription);
  demo->footer(kDemoFooter);
  // Owned by the callback, which CLI11 keeps as long as `app`.
  auto flags = std::make_shared<DemoFlags>();
  demo->add_option("--steps", flags->steps,
                   "Steps to run; 0 only brings the system up and down")
      ->default_val(kDefaultSteps)
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  demo->add_option("--batch-bytes", flags->batch_bytes,
                   "Bytes per batch, split evenly across the devices "
                   "(K/M/G suffixes, at most 1G)")
      ->default_val(kDefaultBatchBytes)
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            absl::StatusOr<uint64_t> bytes =
                ParseByteSize(text, "--batch-bytes");
            if (!bytes.ok()) return std::string(bytes.status().message());
            if (*bytes == 0 || *bytes > kMaxBatchBytes) {
              return absl::StrCat("--batch-bytes=\"", text,
                                  "\" is out of range [1, 1G]");
            }
            return "";
          },
          "BYTES", "byte size"));
  CLI::Option* devices = demo->add_option(
      "--devices", flags->devices,
      "Simulated devices: sets devices= of TPUSHIM_DEVICE (default: "
      "sim://?devices=4 when TPUSHIM_DEVICE is unset)");
  devices->check(CLI::Range(1, 64));
  demo->add_option("--step-ms", flags->step_ms,
                   "Modelled device compute per step, in milliseconds")
      ->default_val(kDefaultStepMs)
      ->check(CLI::Range(0.0, 60000.0));
  demo->add_option("--producers", flags->producers,
                   "Producer threads filling batches")
      ->default_val(kDefaultProducers)
      ->check(CLI::Range(1, 64));
  demo->add_flag("--json", flags->json,
                 "Print one JSON object instead of tables");
  demo->callback([flags, devices, &context] {
    flags->devices_given = devices->count() > 0;
    RunDemo(*flags, context);
  });
}

}  // namespace tpushim::tools
