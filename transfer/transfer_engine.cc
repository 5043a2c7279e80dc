#include "transfer/transfer_engine.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cpu_relax.h"
#include "common/human_bytes.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "logging/log.h"
#include "transfer/pin_tracker.h"
#include "transfer/trace.h"

namespace tpushim {

absl::string_view HostBufferSemanticsName(HostBufferSemantics semantics) {
  switch (semantics) {
    case HostBufferSemantics::kImmutableOnlyDuringCall:
      return "immutable_only_during_call";
    case HostBufferSemantics::kImmutableUntilTransferCompletes:
      return "immutable_until_transfer_completes";
  }
  return "unknown";
}

absl::string_view TransferPathName(TransferPath path) {
  switch (path) {
    case TransferPath::kZeroCopy:
      return "zero_copy";
    case TransferPath::kStaged:
      return "staged";
    case TransferPath::kPinned:
      return "pinned";
  }
  return "unknown";
}

namespace transfer_internal {
namespace {

std::atomic<uint64_t> g_engine_serial{0};

// Transfers up to this size finish within microseconds: their awaiters
// poll before sleeping.
constexpr uint64_t kSpinAwaitMaxBytes = 256 << 10;

// How long a staged host→device copier polls for one of its buffers to
// come back before it sleeps.
constexpr int64_t kCopierSpinNs = 50'000;

// Runs posted work in FIFO order on one thread: copies out of staging that
// should overlap the next DMA, unpinning, freeing device memory — the slow
// parts of completions, kept off the DMA threads.
class HostWorker {
 public:
  HostWorker() {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "tpushim-host");
      Loop();
    });
  }
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;
  ~HostWorker() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }

  void Post(absl::AnyInvocable<void() &&> fn) {
    bool wake;
    {
      MutexLock lock(&mu_);
      queue_.push_back(std::move(fn));
      posted_.fetch_add(1, std::memory_order_release);
      wake = sleeping_;
    }
    if (wake) cv_.Signal();
  }

 private:
  // Idle, the worker polls this long before it sleeps: copies out of
  // staging come every few tens of microseconds in a large transfer.
  static constexpr int64_t kIdleSpinNs = 30'000;

  void Loop() {
    MutexLock lock(&mu_);
    for (;;) {
      if (queue_.empty() && !stop_) {
        const uint64_t seen = posted_.load(std::memory_order_acquire);
        mu_.Unlock();
        SpinFor(kIdleSpinNs, [&] {
          return posted_.load(std::memory_order_acquire) != seen;
        });
        mu_.Lock();
        sleeping_ = true;
        while (queue_.empty() && !stop_) cv_.Wait(&mu_);
        sleeping_ = false;
      }
      if (queue_.empty()) return;
      absl::AnyInvocable<void() &&> fn = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      std::move(fn)();
      mu_.Lock();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> posted_{0};
  std::thread thread_;
};

}  // namespace

// A device buffer's state, shared by its DeviceBuffer handles.
struct Allocation {
  uint64_t engine_serial = 0;
  int device = 0;
  uint64_t address = 0;
  uint64_t size = 0;

  Mutex mu;
  // Operations submitted on the buffer and not finished.
  uint64_t ops ABSL_GUARDED_BY(mu) = 0;
  bool deallocating ABSL_GUARDED_BY(mu) = false;
  bool freed ABSL_GUARDED_BY(mu) = false;
  // Deallocate: what it still waits for (wait_for events not ready, plus
  // one for `ops` reaching 0), its event and first failed dependency.
  int dealloc_waiting ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<EventState> dealloc_event ABSL_GUARDED_BY(mu);
  absl::Status dealloc_error ABSL_GUARDED_BY(mu);
};

enum class OpKind { kToDevice, kFromDevice, kDeviceToDevice };

struct Op;

struct Chunk {
  Op* op = nullptr;
  uint32_t index = 0;
  uint64_t offset = 0;  // within the transfer
  uint64_t length = 0;
  char* staging = nullptr;
  int64_t submit_ns = 0;
};

struct Op {
  uint64_t id = 0;
  OpKind kind = OpKind::kToDevice;
  DmaDirection direction = DmaDirection::kHostToDevice;
  TransferPath path = TransferPath::kZeroCopy;
  // Why a pinned transfer is pinned: 0 over threshold, 1 region off,
  // 2 staging timeout.
  int pin_reason = 0;
  int device = 0;  // the queue's device
  const char* src = nullptr;  // host source (to device)
  char* dst = nullptr;        // host destination (from device)
  uint64_t size = 0;
  std::shared_ptr<Allocation> buffer;  // device side (d2d: source)
  uint64_t buffer_offset = 0;
  std::shared_ptr<Allocation> peer;  // d2d destination
  uint64_t peer_offset = 0;
  HostBufferSemantics semantics =
      HostBufferSemantics::kImmutableUntilTransferCompletes;
  std::shared_ptr<EventState> event;
  int64_t submit_ns = 0;
  int64_t start_ns = 0;  // 0 until started
  uint64_t staging_chunk = 0;  // staged: bytes per staging buffer

  // Dependencies: unresolved wait_for events, plus one held by Submit.
  std::atomic<int> deps_pending{1};
  std::atomic<bool> deps_ready{false};

  // Chunks not yet completed, plus one held by the starter.
  std::atomic<uint64_t> outstanding{1};
  std::vector<Chunk> chunks;
  // Pinned path.
  HostWindowId window = kInvalidHostWindow;
  PinTracker::Lease lease;
  // Kept alive from start to finish (chunks point into it).
  std::shared_ptr<Op> self;
  // Set when the engine no longer reads or writes the caller's buffer
  // (kImmutableOnlyDuringCall waits for it).
  Notification host_released;

  Mutex mu;
  absl::Status error ABSL_GUARDED_BY(mu);
  // Staged host→device: buffers whose chunk completed, ready for reuse,
  // and whether the copier still wants them.
  std::vector<char*> free_staging ABSL_GUARDED_BY(mu);
  std::atomic<uint32_t> recycled{0};  // free_staging.size(), for polling
  bool copying ABSL_GUARDED_BY(mu) = true;
  bool copier_sleeping ABSL_GUARDED_BY(mu) = false;
  CondVar staging_cv;
  // Staged device→host: the next chunk to submit.
  uint32_t next_chunk ABSL_GUARDED_BY(mu) = 0;

  void RecordError(const absl::Status& s) {
    MutexLock lock(&mu);
    if (error.ok()) error = s;
  }
  absl::Status Error() {
    MutexLock lock(&mu);
    return error;
  }
};

class Engine {
 public:
  Engine(std::vector<Device*> devices, PremappedRegion* region, Os* os,
         TransferEngine::Config config, std::array<uint64_t, 2> chunk_bytes,
         uint64_t max_staging);
  ~Engine();

  // `region_windows`: the region's windows, already registered (or empty).
  absl::Status Start(std::vector<HostWindowId> region_windows);
  void Shutdown();

  int device_count() const { return static_cast<int>(devices_.size()); }
  absl::StatusOr<DeviceBuffer> Allocate(int device, uint64_t size);
  absl::StatusOr<Event> Deallocate(const DeviceBuffer& buffer,
                                   absl::Span<const Event> wait_for);
  absl::StatusOr<Event> Submit(std::shared_ptr<Op> op,
                               absl::Span<const Event> wait_for);
  // INVALID_ARGUMENT when `wait_for` holds a pending event of another
  // engine: its continuation would call into this one, which may be gone
  // by then.
  absl::Status CheckWaitFor(absl::Span<const Event> wait_for) const {
    for (const Event& e : wait_for) {
      const auto& state = e.state();
      if (state->owner() != nullptr && state->owner() != this &&
          !state->IsReady()) {
        return absl::InvalidArgumentError(
            "wait_for holds a pending event of another system; wait for "
            "it (Await or a callback) before submitting here");
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<Op>> NewHostOp(
      OpKind kind, const DeviceBuffer& buffer, uint64_t offset,
      const void* host, uint64_t size, HostBufferSemantics semantics);
  absl::StatusOr<std::shared_ptr<Op>> NewDeviceToDeviceOp(
      const DeviceBuffer& src, uint64_t src_offset, const DeviceBuffer& dst,
      uint64_t dst_offset, uint64_t size);
  TransferPath PathFor(const void* host, uint64_t size, int* reason) const;
  TransferEngine::Stats GetStats() const;

  static std::shared_ptr<Allocation> AllocationOf(const DeviceBuffer& b) {
    return b.allocation_;
  }

 private:
  struct Queue {
    int device = 0;
    DmaDirection direction = DmaDirection::kHostToDevice;
    Device* dev = nullptr;

    Mutex mu;
    CondVar cv;
    std::deque<std::shared_ptr<Op>> pending ABSL_GUARDED_BY(mu);
    bool starting ABSL_GUARDED_BY(mu) = false;
    bool stop ABSL_GUARDED_BY(mu) = false;
    std::thread worker;

    // Descriptors the ring had no room for, in order. Device::Submit is
    // called under ring_mu (it never blocks) so the ring sees one order.
    Mutex ring_mu;
    std::deque<DmaDescriptor> overflow ABSL_GUARDED_BY(ring_mu);
    std::atomic<bool> has_overflow{false};

    std::atomic<uint64_t> submitted{0}, completed{0}, failed{0},
        cancelled{0}, descriptors{0}, ring_full{0}, in_flight{0};
  };

  // The sink of one device.
  class Sink final : public DmaCompletionSink {
   public:
    Sink(Engine* engine, int device) : engine_(engine), device_(device) {}
    void OnDmaComplete(DmaDirection direction,
                       absl::Span<const DmaCompletion> completions) override {
      engine_->OnDmaComplete(device_, direction, completions);
    }

   private:
    Engine* const engine_;
    const int device_;
  };

  Queue& QueueOf(int device, DmaDirection d) {
    return *queues_[device * kDmaDirectionCount + static_cast<int>(d)];
  }
  absl::Status CheckOpen() const;
  absl::StatusOr<std::shared_ptr<Allocation>> UseBuffer(
      const DeviceBuffer& buffer, uint64_t offset, uint64_t size,
      absl::string_view what);
  void ReleaseBufferUse(const std::shared_ptr<Allocation>& a);
  void DeallocStep(const std::shared_ptr<Allocation>& a);
  void FreeAllocation(const std::shared_ptr<Allocation>& a);

  void DepDone(const std::shared_ptr<Op>& op);
  void Kick(Queue& q);
  void WorkerLoop(Queue& q);
  // Starts `op`. With `may_block` false, returns false (having done
  // nothing) when starting would have to wait for staging room.
  bool StartOp(const std::shared_ptr<Op>& op, bool may_block);
  bool InlineStartable(const Op& op) const;
  void StartDescriptors(Op& op, HostWindowId window, uint64_t host_base);
  // The first staging buffer of a staged transfer, waiting up to
  // Config::staging_wait when `may_block`. kWouldBlock: none now and
  // `may_block` is false (nothing done). kHandled: none in time, so the
  // operation went pinned, or was cancelled by shutdown.
  enum class FirstStaging { kAcquired, kWouldBlock, kHandled };
  FirstStaging AcquireFirstStaging(Op& op, bool may_block, char** first);
  bool StartStagedToDevice(Op& op, bool may_block);
  bool StartStagedFromDevice(Op& op, bool may_block);
  void StartPinned(Op& op, int reason);
  void SubmitChunk(Op& op, Chunk& chunk, HostWindowId window,
                   uint64_t host_offset);
  void SubmitDescriptors(Queue& q, absl::Span<const DmaDescriptor> d);
  void DrainOverflow(Queue& q);
  void SubmitOverflowLocked(Queue& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.ring_mu);
  void ChunkDone(Op& op, uint64_t n = 1);
  void FinishOp(Op& op);
  void CompleteOp(Op& op);
  void CancelUnstarted(const std::shared_ptr<Op>& op, absl::Status status);
  void OnDmaComplete(int device, DmaDirection direction,
                     absl::Span<const DmaCompletion> completions);
  void NextFromDevice(Op& op, Chunk& chunk, bool ok);
  void WarnPinned(const Op& op, int reason);

  char* AcquireStaging(uint64_t bytes, int64_t deadline_ns, bool* waited);
  void ReleaseStaging(char* p, uint64_t bytes);

  // Constant after construction.
  const uint64_t serial_;
  const std::vector<Device*> devices_;
  PremappedRegion* const region_;
  Os* const os_;
  const TransferEngine::Config config_;
  // Staging chunk per direction (host→device, device→host).
  const std::array<uint64_t, 2> chunk_bytes_;
  const uint64_t max_staging_;
  const uint64_t threshold_;
  const int64_t origin_ns_;

  CallbackExecutor callbacks_;
  HostWorker host_worker_;
  PinTracker pins_;
  std::unique_ptr<TraceRecorder> trace_;
  std::vector<std::unique_ptr<Sink>> sinks_;
  std::vector<HostWindowId> region_windows_;  // per device
  std::vector<std::unique_ptr<Queue>> queues_;
  std::atomic<uint64_t> next_op_id_{1};

  mutable Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  CondVar shut_down_cv_;
  absl::flat_hash_map<Allocation*, std::shared_ptr<Allocation>> live_
      ABSL_GUARDED_BY(mu_);
  uint64_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> closing_{false};  // mirrors shutting_down_, lock-free

  // Operations not yet ready; Shutdown waits for 0.
  Mutex idle_mu_;
  CondVar idle_cv_;
  uint64_t unfinished_ ABSL_GUARDED_BY(idle_mu_) = 0;
  // Stats::events_pending: like unfinished_, but decremented just before
  // the event is resolved (unfinished_ only after, for Shutdown), so a
  // caller that saw every event ready reads 0.
  std::atomic<uint64_t> events_not_ready_{0};
  // DMA threads inside OnDmaComplete. The one that completes the last
  // operation still touches the engine afterwards (DrainOverflow, a
  // HostWorker wake-up), so Shutdown waits for 0 after unfinished_ is 0.
  std::atomic<int> in_completion_{0};

  // Staging budget.
  std::atomic<uint64_t> staging_in_flight_{0};
  std::atomic<uint64_t> staging_peak_{0};
  Mutex staging_mu_;
  CondVar staging_cv_;
  int staging_waiters_ ABSL_GUARDED_BY(staging_mu_) = 0;
  std::atomic<uint64_t> staging_waits_{0};
  std::atomic<int64_t> staging_wait_ns_{0};

  // Statistics.
  struct PathCounters {
    std::atomic<uint64_t> transfers{0}, bytes{0}, failed{0};
    std::atomic<int64_t> busy_ns{0};
    std::atomic<int64_t> active_ns{0};
  };
  std::array<std::array<PathCounters, kTransferPathCount>, 2> host_stats_;
  PathCounters d2d_stats_;
  std::array<std::atomic<uint64_t>, 3> pinned_reasons_{};

  // Rate limit of the pinned-path WARNING.
  Mutex warn_mu_;
  int64_t last_warning_ns_ ABSL_GUARDED_BY(warn_mu_) = 0;
  uint64_t suppressed_warnings_ ABSL_GUARDED_BY(warn_mu_) = 0;
};

Engine::Engine(std::vector<Device*> devices, PremappedRegion* region, Os* os,
               TransferEngine::Config config,
               std::array<uint64_t, 2> chunk_bytes,
               uint64_t max_staging)
    : serial_(g_engine_serial.fetch_add(1) + 1),
      devices_(std::move(devices)),
      region_(region),
      os_(os),
      config_(std::move(config)),
      chunk_bytes_(chunk_bytes),
      max_staging_(max_staging),
      threshold_(region == nullptr ? 0 : region->allocator().threshold()),
      origin_ns_(os->MonotonicNanos()),
      pins_(os) {
  if (!config_.trace_file.empty()) {
    trace_ = std::make_unique<TraceRecorder>(config_.trace_file, os_,
                                             origin_ns_);
  }
}

absl::Status Engine::Start(std::vector<HostWindowId> region_windows) {
  const bool registered = !region_windows.empty();
  region_windows_ = std::move(region_windows);
  for (size_t i = 0; i < devices_.size(); ++i) {
    Device* dev = devices_[i];
    if (region_ != nullptr && !registered) {
      absl::StatusOr<HostWindowId> w =
          dev->RegisterHostWindow(region_->base(), region_->size());
      if (!w.ok()) {
        for (size_t j = 0; j < region_windows_.size(); ++j) {
          (void)devices_[j]->UnregisterHostWindow(region_windows_[j]);
        }
        region_windows_.clear();
        return absl::Status(
            w.status().code(),
            absl::StrCat("Registering the premapped region with ",
                         dev->info().name,
                         " failed: ", w.status().message()));
      }
      region_windows_.push_back(*w);
    }
    if (trace_) trace_->NameDevice(static_cast<int>(i), dev->info().name);
  }
  for (size_t i = 0; i < devices_.size(); ++i) {
    sinks_.push_back(std::make_unique<Sink>(this, static_cast<int>(i)));
    devices_[i]->SetCompletionSink(sinks_.back().get());
    for (int d = 0; d < kDmaDirectionCount; ++d) {
      auto q = std::make_unique<Queue>();
      q->device = static_cast<int>(i);
      q->direction = static_cast<DmaDirection>(d);
      q->dev = devices_[i];
      queues_.push_back(std::move(q));
    }
  }
  for (auto& q : queues_) {
    Queue* qp = q.get();
    q->worker = std::thread([this, qp] {
      const std::string name = absl::StrFormat(
          "xfer%d-%s", qp->device, DmaDirectionName(qp->direction));
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      WorkerLoop(*qp);
    });
  }
  return absl::OkStatus();
}

Engine::~Engine() { Shutdown(); }

absl::Status Engine::CheckOpen() const {
  if (closing_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        "the transfer engine has been shut down");
  }
  return absl::OkStatus();
}

// ---- Device buffers --------------------------------------------------------

absl::StatusOr<DeviceBuffer> Engine::Allocate(int device, uint64_t size) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  if (device < 0 || device >= device_count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Allocate: device ", device, " does not exist (devices 0..",
        device_count() - 1, ")"));
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
  host_worker_.Post([this, a] {
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

// ---- Submission ------------------------------------------------------------

TransferPath Engine::PathFor(const void* host, uint64_t size,
                             int* reason) const {
  *reason = 0;
  if (region_ == nullptr) {
    *reason = 1;
    return TransferPath::kPinned;
  }
  if (size > 0 && region_->allocator().Contains(host, size)) {
    return TransferPath::kZeroCopy;
  }
  if (size <= threshold_) return TransferPath::kStaged;
  return TransferPath::kPinned;
}

absl::StatusOr<std::shared_ptr<Op>> Engine::NewHostOp(
    OpKind kind, const DeviceBuffer& buffer, uint64_t offset,
    const void* host, uint64_t size, HostBufferSemantics semantics) {
  const bool to_device = kind == OpKind::kToDevice;
  const char* what = to_device ? "TransferToDevice" : "TransferFromDevice";
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  if (host == nullptr && size > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the host buffer is null"));
  }
  if (size > 0 && reinterpret_cast<uintptr_t>(host) + size <
                      reinterpret_cast<uintptr_t>(host)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the host range wraps around the address space"));
  }
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<Allocation> a,
                           UseBuffer(buffer, offset, size, what));
  auto op = std::make_shared<Op>();
  op->kind = kind;
  op->direction =
      to_device ? DmaDirection::kHostToDevice : DmaDirection::kDeviceToHost;
  op->device = a->device;
  op->path = PathFor(host, size, &op->pin_reason);
  if (to_device) {
    op->src = static_cast<const char*>(host);
  } else {
    op->dst = static_cast<char*>(const_cast<void*>(host));
  }
  op->size = size;
  op->buffer = std::move(a);
  op->buffer_offset = offset;
  op->semantics = semantics;
  op->staging_chunk = std::min(chunk_bytes_[to_device ? 0 : 1], size);
  return op;
}

absl::StatusOr<std::shared_ptr<Op>> Engine::NewDeviceToDeviceOp(
    const DeviceBuffer& src, uint64_t src_offset, const DeviceBuffer& dst,
    uint64_t dst_offset, uint64_t size) {
  TPUSHIM_RETURN_IF_ERROR(CheckOpen());
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<Allocation> s,
      UseBuffer(src, src_offset, size, "TransferDeviceToDevice (source)"));
  absl::StatusOr<std::shared_ptr<Allocation>> d =
      UseBuffer(dst, dst_offset, size, "TransferDeviceToDevice (destination)");
  if (!d.ok()) {
    ReleaseBufferUse(s);
    return d.status();
  }
  auto op = std::make_shared<Op>();
  op->kind = OpKind::kDeviceToDevice;
  op->direction = DmaDirection::kDeviceToDevice;
  op->device = s->device;
  op->size = size;
  op->buffer = std::move(s);
  op->buffer_offset = src_offset;
  op->peer = *std::move(d);
  op->peer_offset = dst_offset;
  return op;
}

absl::StatusOr<Event> Engine::Submit(std::shared_ptr<Op> op,
                                     absl::Span<const Event> wait_for) {
  op->id = next_op_id_.fetch_add(1, std::memory_order_relaxed);
  op->event = std::make_shared<EventState>(&callbacks_, this);
  // Awaiting a small transfer polls; a large one sleeps at once.
  if (op->size > kSpinAwaitMaxBytes) op->event->set_await_spin_ns(0);
  op->submit_ns = os_->MonotonicNanos();
  Queue& q = QueueOf(op->device, op->direction);
  {
    MutexLock lock(&idle_mu_);
    ++unfinished_;
  }
  events_not_ready_.fetch_add(1, std::memory_order_acq_rel);
  q.submitted.fetch_add(1, std::memory_order_relaxed);
  op->deps_pending.store(static_cast<int>(wait_for.size()) + 1,
                         std::memory_order_relaxed);
  bool queue_idle;
  bool stopped;
  {
    MutexLock lock(&q.mu);
    stopped = q.stop;
    queue_idle = q.pending.empty() && !q.starting;
    if (!stopped) q.pending.push_back(op);
  }
  if (stopped) {
    // Lost the race with Shutdown, which has already emptied the queue.
    CancelUnstarted(op, absl::CancelledError(
                            "the transfer engine shut down before the "
                            "transfer started"));
    return Event(op->event);
  }
  for (const Event& e : wait_for) {
    e.state()->AddContinuation([this, op](const absl::Status& s) {
      if (!s.ok()) op->RecordError(s);
      DepDone(op);
    });
  }
  // Drop Submit's hold on the dependencies. When they are all ready and the
  // queue was idle, start here, on the caller's thread, if that cannot
  // block: no thread hop for the common small transfer.
  Event event(op->event);
  if (op->deps_pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    op->deps_ready.store(true, std::memory_order_release);
    bool inline_start = false;
    if (queue_idle && InlineStartable(*op)) {
      MutexLock lock(&q.mu);
      if (!q.starting && !q.pending.empty() && q.pending.front() == op) {
        q.pending.pop_front();
        q.starting = true;
        inline_start = true;
      }
    }
    if (inline_start) {
      const bool started = StartOp(op, /*may_block=*/false);
      bool wake;
      bool cancel = false;
      {
        MutexLock lock(&q.mu);
        if (!started) {
          if (q.stop) {
            cancel = true;
          } else {
            q.pending.push_front(op);
          }
        }
        q.starting = false;
        wake = !q.pending.empty() &&
               q.pending.front()->deps_ready.load(std::memory_order_acquire);
      }
      if (cancel) {
        CancelUnstarted(op, absl::CancelledError(
                                "the transfer engine shut down before the "
                                "transfer started"));
      }
      if (wake) q.cv.Signal();
    } else {
      Kick(q);
    }
  }
  if (op->semantics == HostBufferSemantics::kImmutableOnlyDuringCall) {
    op->host_released.WaitForNotification();
  }
  return event;
}

void Engine::DepDone(const std::shared_ptr<Op>& op) {
  if (op->deps_pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  op->deps_ready.store(true, std::memory_order_release);
  Kick(QueueOf(op->device, op->direction));
}

void Engine::Kick(Queue& q) {
  bool wake;
  {
    MutexLock lock(&q.mu);
    wake = !q.starting && !q.pending.empty() &&
           q.pending.front()->deps_ready.load(std::memory_order_acquire);
  }
  if (wake) q.cv.Signal();
}

void Engine::WorkerLoop(Queue& q) {
  MutexLock lock(&q.mu);
  for (;;) {
    while (!q.stop &&
           (q.starting || q.pending.empty() ||
            !q.pending.front()->deps_ready.load(std::memory_order_acquire))) {
      q.cv.Wait(&q.mu);
    }
    if (q.stop) return;
    std::shared_ptr<Op> op = std::move(q.pending.front());
    q.pending.pop_front();
    q.starting = true;
    q.mu.Unlock();
    StartOp(op, /*may_block=*/true);
    q.mu.Lock();
    q.starting = false;
  }
}

bool Engine::InlineStartable(const Op& op) const {
  if (op.kind == OpKind::kDeviceToDevice) return true;
  switch (op.path) {
    case TransferPath::kZeroCopy:
      return true;
    case TransferPath::kStaged:
      return op.size <= op.staging_chunk * config_.staging_depth;
    case TransferPath::kPinned:
      return op.size <= config_.descriptor_bytes;
  }
  return false;
}

// ---- Starting --------------------------------------------------------------

bool Engine::StartOp(const std::shared_ptr<Op>& op, bool may_block) {
  Op& o = *op;
  absl::Status dep_error = o.Error();
  if (!dep_error.ok() || closing_.load(std::memory_order_acquire)) {
    CancelUnstarted(op, dep_error.ok()
                            ? absl::CancelledError(
                                  "the transfer engine shut down before the "
                                  "transfer started")
                            : dep_error);
    return true;
  }
  QueueOf(o.device, o.direction)
      .in_flight.fetch_add(1, std::memory_order_relaxed);
  o.start_ns = os_->MonotonicNanos();

  if (o.kind == OpKind::kDeviceToDevice || o.path != TransferPath::kStaged) {
    o.self = op;
    if (o.kind == OpKind::kDeviceToDevice) {
      StartDescriptors(o, kInvalidHostWindow, 0);
    } else if (o.path == TransferPath::kZeroCopy) {
      const uint64_t base = reinterpret_cast<uintptr_t>(region_->base());
      const uint64_t host = reinterpret_cast<uintptr_t>(
          o.kind == OpKind::kToDevice ? static_cast<const void*>(o.src)
                                      : static_cast<const void*>(o.dst));
      StartDescriptors(o, region_windows_[o.device], host - base);
    } else {
      StartPinned(o, o.pin_reason);
    }
    return true;
  }

  o.self = op;
  const bool started = o.kind == OpKind::kToDevice
                           ? StartStagedToDevice(o, may_block)
                           : StartStagedFromDevice(o, may_block);
  if (!started) {
    o.self.reset();
    QueueOf(o.device, o.direction)
        .in_flight.fetch_sub(1, std::memory_order_relaxed);
  }
  return started;
}

void Engine::StartDescriptors(Op& op, HostWindowId window,
                              uint64_t host_base) {
  const uint64_t step = std::max<uint64_t>(config_.descriptor_bytes, 1);
  const uint64_t n = (op.size + step - 1) / step;
  op.chunks.resize(n);
  op.outstanding.fetch_add(n, std::memory_order_relaxed);
  for (uint64_t i = 0; i < n; ++i) {
    Chunk& c = op.chunks[i];
    c.op = &op;
    c.index = static_cast<uint32_t>(i);
    c.offset = i * step;
    c.length = std::min(step, op.size - c.offset);
    SubmitChunk(op, c, window, host_base + c.offset);
  }
  ChunkDone(op);  // the starter's hold
}

void Engine::SubmitChunk(Op& op, Chunk& c, HostWindowId window,
                         uint64_t host_offset) {
  DmaDescriptor d;
  d.user_data = reinterpret_cast<uintptr_t>(&c);
  d.length = c.length;
  d.host_offset = host_offset;
  d.device_address = op.buffer->address + op.buffer_offset + c.offset;
  d.host_window = window;
  d.direction = op.direction;
  if (op.kind == OpKind::kDeviceToDevice) {
    d.peer_device = static_cast<uint32_t>(op.peer->device);
    d.peer_address = op.peer->address + op.peer_offset + c.offset;
  }
  c.submit_ns = trace_ ? os_->MonotonicNanos() : 0;
  SubmitDescriptors(QueueOf(op.device, op.direction), {&d, 1});
}

void Engine::SubmitDescriptors(Queue& q, absl::Span<const DmaDescriptor> d) {
  MutexLock lock(&q.ring_mu);
  size_t accepted = 0;
  if (q.overflow.empty()) accepted = q.dev->Submit(q.direction, d);
  if (accepted < d.size()) {
    q.overflow.insert(q.overflow.end(), d.begin() + accepted, d.end());
    q.ring_full.fetch_add(d.size() - accepted, std::memory_order_relaxed);
    // Publish the overflow, then try the ring again: a completion that
    // freed a slot before it could see the flag left that slot for us
    // (Dekker, with the fence in OnDmaComplete), so the overflow is never
    // stranded with nothing in flight to drain it.
    q.has_overflow.store(true, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    SubmitOverflowLocked(q);
  }
}

void Engine::SubmitOverflowLocked(Queue& q) {
  while (!q.overflow.empty()) {
    DmaDescriptor batch[32];
    const size_t n = std::min<size_t>(q.overflow.size(), 32);
    std::copy_n(q.overflow.begin(), n, batch);
    const size_t accepted = q.dev->Submit(q.direction, {batch, n});
    q.overflow.erase(q.overflow.begin(), q.overflow.begin() + accepted);
    if (accepted < n) break;
  }
  q.has_overflow.store(!q.overflow.empty(), std::memory_order_seq_cst);
}

void Engine::DrainOverflow(Queue& q) {
  // The device freed ring slots before calling us; see SubmitDescriptors.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!q.has_overflow.load(std::memory_order_seq_cst)) return;
  MutexLock lock(&q.ring_mu);
  SubmitOverflowLocked(q);
}

char* Engine::AcquireStaging(uint64_t bytes, int64_t deadline_ns,
                             bool* waited) {
  int64_t wait_start = 0;
  for (;;) {
    uint64_t cur = staging_in_flight_.load(std::memory_order_relaxed);
    bool reserved = false;
    while (cur + bytes <= max_staging_) {
      if (staging_in_flight_.compare_exchange_weak(
              cur, cur + bytes, std::memory_order_acq_rel)) {
        reserved = true;
        break;
      }
    }
    if (reserved) {
      char* p = static_cast<char*>(region_->allocator().TryAllocate(bytes));
      if (p != nullptr) {
        const uint64_t now_in_flight = cur + bytes;
        uint64_t peak = staging_peak_.load(std::memory_order_relaxed);
        while (now_in_flight > peak &&
               !staging_peak_.compare_exchange_weak(peak, now_in_flight)) {
        }
        if (trace_) trace_->StagingBytes(os_->MonotonicNanos(), now_in_flight);
        if (wait_start != 0) {
          staging_wait_ns_.fetch_add(os_->MonotonicNanos() - wait_start,
                                     std::memory_order_relaxed);
        }
        return p;
      }
      staging_in_flight_.fetch_sub(bytes, std::memory_order_acq_rel);
    }
    const int64_t now = os_->MonotonicNanos();
    if (now >= deadline_ns || closing_.load(std::memory_order_acquire)) {
      if (wait_start != 0) {
        staging_wait_ns_.fetch_add(now - wait_start,
                                   std::memory_order_relaxed);
      }
      return nullptr;
    }
    if (wait_start == 0) {
      wait_start = now;
      if (waited != nullptr && !*waited) {
        *waited = true;
        staging_waits_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    MutexLock lock(&staging_mu_);
    ++staging_waiters_;
    // Re-check under the lock: a release between the attempt and here
    // signalled nobody. A short bounded wait covers the allocator side
    // (space freed by Free of a user buffer signals no one).
    const int64_t until = std::min(deadline_ns, now + 1'000'000);
    if (staging_in_flight_.load(std::memory_order_acquire) + bytes >
        max_staging_) {
      staging_cv_.WaitUntilMonotonicNanos(&staging_mu_, until);
    } else {
      staging_cv_.WaitUntilMonotonicNanos(&staging_mu_,
                                          std::min(until, now + 200'000));
    }
    --staging_waiters_;
  }
}

void Engine::ReleaseStaging(char* p, uint64_t bytes) {
  absl::Status s = region_->allocator().Free(p);
  if (!s.ok()) LOG(ERROR) << "Freeing a staging buffer failed: " << s;
  const uint64_t now_in_flight =
      staging_in_flight_.fetch_sub(bytes, std::memory_order_acq_rel) - bytes;
  if (trace_) trace_->StagingBytes(os_->MonotonicNanos(), now_in_flight);
  bool wake;
  {
    MutexLock lock(&staging_mu_);
    wake = staging_waiters_ > 0;
  }
  if (wake) staging_cv_.SignalAll();
}

Engine::FirstStaging Engine::AcquireFirstStaging(Op& op, bool may_block,
                                                 char** first) {
  const int64_t deadline =
      may_block ? os_->MonotonicNanos() +
                      absl::ToInt64Nanoseconds(config_.staging_wait)
                : 0;
  bool waited = false;
  *first = AcquireStaging(op.staging_chunk, deadline, &waited);
  if (*first != nullptr) return FirstStaging::kAcquired;
  if (!may_block) return FirstStaging::kWouldBlock;
  if (closing_.load(std::memory_order_acquire)) {
    op.RecordError(absl::CancelledError(
        "the transfer engine shut down before the transfer started"));
    ChunkDone(op);  // the starter's hold: the operation completes
    return FirstStaging::kHandled;
  }
  pinned_reasons_[2].fetch_add(1, std::memory_order_relaxed);
  StartPinned(op, 2);
  return FirstStaging::kHandled;
}

bool Engine::StartStagedToDevice(Op& op, bool may_block) {
  const uint64_t step = op.staging_chunk;
  const uint64_t n = op.size == 0 ? 0 : (op.size + step - 1) / step;
  char* first = nullptr;
  if (n > 0) {
    switch (AcquireFirstStaging(op, may_block, &first)) {
      case FirstStaging::kAcquired:
        break;
      case FirstStaging::kWouldBlock:
        return false;
      case FirstStaging::kHandled:
        return true;
    }
  }
  op.chunks.resize(n);
  op.outstanding.fetch_add(n, std::memory_order_relaxed);
  int held = first != nullptr ? 1 : 0;
  char* buf = first;
  uint64_t i = 0;
  for (; i < n; ++i) {
    if (buf == nullptr) {
      {
        MutexLock lock(&op.mu);
        if (!op.free_staging.empty()) {
          buf = op.free_staging.back();
          op.free_staging.pop_back();
          op.recycled.fetch_sub(1, std::memory_order_relaxed);
        }
      }
      if (buf == nullptr && held < config_.staging_depth) {
        buf = AcquireStaging(step, 0, nullptr);
        if (buf != nullptr) ++held;
      }
      if (buf == nullptr) {
        // Our own chunks in flight come back: wait for one, polling first
        // (a chunk's DMA takes tens of microseconds).
        SpinFor(kCopierSpinNs, [&op] {
          return op.recycled.load(std::memory_order_acquire) > 0;
        });
        MutexLock lock(&op.mu);
        op.copier_sleeping = true;
        while (op.free_staging.empty()) op.staging_cv.Wait(&op.mu);
        op.copier_sleeping = false;
        buf = op.free_staging.back();
        op.free_staging.pop_back();
        op.recycled.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    const bool closing = closing_.load(std::memory_order_acquire);
    if (closing || !op.Error().ok()) {
      // A chunk failed (the transfer has its status), or shutdown.
      if (closing) {
        op.RecordError(absl::CancelledError(
            "the transfer engine shut down during the transfer"));
      }
      MutexLock lock(&op.mu);
      op.free_staging.push_back(buf);
      buf = nullptr;
      break;
    }
    Chunk& c = op.chunks[i];
    c.op = &op;
    c.index = static_cast<uint32_t>(i);
    c.offset = i * step;
    c.length = std::min(step, op.size - c.offset);
    c.staging = buf;
    std::memcpy(buf, op.src + c.offset, c.length);
    buf = nullptr;
    const uint64_t host_offset =
        reinterpret_cast<uintptr_t>(c.staging) -
        reinterpret_cast<uintptr_t>(region_->base());
    SubmitChunk(op, c, region_windows_[op.device], host_offset);
  }
  // Done copying: the caller's buffer is free, spare buffers go back.
  op.host_released.Notify();
  std::vector<char*> spare;
  {
    MutexLock lock(&op.mu);
    op.copying = false;
    spare.swap(op.free_staging);
    op.recycled.store(0, std::memory_order_relaxed);
  }
  for (char* p : spare) ReleaseStaging(p, step);
  if (i < n) ChunkDone(op, n - i);  // never submitted
  ChunkDone(op);                    // the starter's hold
  return true;
}

bool Engine::StartStagedFromDevice(Op& op, bool may_block) {
  const uint64_t step = op.staging_chunk;
  const uint64_t n = op.size == 0 ? 0 : (op.size + step - 1) / step;
  std::vector<char*> bufs;
  if (n > 0) {
    char* first = nullptr;
    switch (AcquireFirstStaging(op, may_block, &first)) {
      case FirstStaging::kAcquired:
        break;
      case FirstStaging::kWouldBlock:
        return false;
      case FirstStaging::kHandled:
        return true;
    }
    bufs.push_back(first);
    while (bufs.size() < std::min<uint64_t>(n, config_.staging_depth)) {
      char* p = AcquireStaging(step, 0, nullptr);
      if (p == nullptr) break;
      bufs.push_back(p);
    }
  }
  op.chunks.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    Chunk& c = op.chunks[i];
    c.op = &op;
    c.index = static_cast<uint32_t>(i);
    c.offset = i * step;
    c.length = std::min(step, op.size - c.offset);
  }
  op.outstanding.fetch_add(n, std::memory_order_relaxed);
  {
    MutexLock lock(&op.mu);
    op.next_chunk = static_cast<uint32_t>(bufs.size());
  }
  const uint64_t base = reinterpret_cast<uintptr_t>(region_->base());
  for (size_t i = 0; i < bufs.size(); ++i) {
    Chunk& c = op.chunks[i];
    c.staging = bufs[i];
    SubmitChunk(op, c, region_windows_[op.device],
                reinterpret_cast<uintptr_t>(c.staging) - base);
  }
  ChunkDone(op);  // the starter's hold
  return true;
}

void Engine::StartPinned(Op& op, int reason) {
  if (op.path == TransferPath::kStaged) op.path = TransferPath::kPinned;
  if (reason != 2) {
    pinned_reasons_[reason].fetch_add(1, std::memory_order_relaxed);
  }
  if (op.size == 0) {
    ChunkDone(op);
    return;
  }
  WarnPinned(op, reason);
  void* host = op.kind == OpKind::kToDevice
                   ? const_cast<char*>(op.src)
                   : static_cast<void*>(op.dst);
  absl::StatusOr<PinTracker::Lease> lease = pins_.Pin(host, op.size);
  if (!lease.ok()) {
    op.RecordError(absl::Status(
        lease.status().code(),
        absl::StrCat("Pinning ", HumanReadableBytes(op.size),
                     " of caller memory for a ",
                     DmaDirectionDescription(op.direction),
                     " transfer failed: ", lease.status().message(),
                     ". Raise the memlock limit (ulimit -l) or allocate the "
                     "buffer from the premapped region.")));
    ChunkDone(op);
    return;
  }
  absl::StatusOr<HostWindowId> window =
      devices_[op.device]->RegisterHostWindow(host, op.size);
  if (!window.ok()) {
    pins_.Unpin(*std::move(lease));
    op.RecordError(window.status());
    ChunkDone(op);
    return;
  }
  op.lease = *std::move(lease);
  op.window = *window;
  StartDescriptors(op, op.window, 0);
}

void Engine::WarnPinned(const Op& op, int reason) {
  const int64_t now = os_->MonotonicNanos();
  uint64_t suppressed;
  {
    MutexLock lock(&warn_mu_);
    if (last_warning_ns_ != 0 &&
        now - last_warning_ns_ <
            absl::ToInt64Nanoseconds(config_.fallback_warning_interval)) {
      ++suppressed_warnings_;
      return;
    }
    last_warning_ns_ = now;
    suppressed = suppressed_warnings_;
    suppressed_warnings_ = 0;
  }
  std::string why;
  switch (reason) {
    case 0:
      why = absl::StrCat(
          "it is larger than TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=",
          threshold_, " (", HumanReadableBytes(threshold_), ")");
      break;
    case 1:
      why =
          "the premapped region is off (TPU_PREMAPPED_BUFFER_SIZE=0, so "
          "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES is 0)";
      break;
    default:
      why = absl::StrCat(
          "no staging space in the premapped region freed up within ",
          absl::FormatDuration(config_.staging_wait), " (",
          HumanReadableBytes(
              staging_in_flight_.load(std::memory_order_relaxed)),
          " of ", HumanReadableBytes(max_staging_),
          " staging in flight; TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=",
          threshold_, ")");
      break;
  }
  LOG(WARNING) << "Transfer of " << HumanReadableBytes(op.size) << " "
               << DmaDirectionDescription(op.direction) << " on "
               << devices_[op.device]->info().name
               << " pins the caller's memory for the transfer (slower): "
               << why << "."
               << (suppressed > 0
                       ? absl::StrCat(" ", suppressed,
                                      " more such transfers since the last "
                                      "message.")
                       : std::string());
}

// ---- Completion ------------------------------------------------------------

void Engine::OnDmaComplete(int device, DmaDirection direction,
                           absl::Span<const DmaCompletion> completions) {
  // Counted before any of the completions can finish an operation (and so
  // before unfinished_ can reach 0), uncounted last.
  in_completion_.fetch_add(1, std::memory_order_relaxed);
  Queue& q = QueueOf(device, direction);
  for (const DmaCompletion& c : completions) {
    Chunk& chunk = *reinterpret_cast<Chunk*>(c.user_data);
    Op& op = *chunk.op;
    q.descriptors.fetch_add(1, std::memory_order_relaxed);
    if (trace_) {
      trace_->Descriptor(
          device, static_cast<int>(direction),
          // The names are literals: .data() is NUL-terminated.
          op.kind == OpKind::kDeviceToDevice ? "copy"
                                             : TransferPathName(op.path).data(),
          DmaDirectionName(direction).data(), op.id, chunk.index, chunk.length,
          chunk.submit_ns, c.start_ns, c.end_ns, !c.status.ok());
    }
    if (!c.status.ok()) op.RecordError(c.status);
    if (op.path == TransferPath::kStaged &&
        op.kind != OpKind::kDeviceToDevice) {
      if (op.kind == OpKind::kToDevice) {
        bool reuse;
        bool wake = false;
        {
          MutexLock lock(&op.mu);
          reuse = op.copying;
          if (reuse) {
            op.free_staging.push_back(chunk.staging);
            op.recycled.fetch_add(1, std::memory_order_release);
            wake = op.copier_sleeping;
          }
        }
        if (reuse) {
          if (wake) op.staging_cv.Signal();
        } else {
          ReleaseStaging(chunk.staging, op.staging_chunk);
        }
        chunk.staging = nullptr;
      } else {
        if (c.status.ok() && chunk.length > config_.inline_copy_bytes) {
          Chunk* cp = &chunk;
          host_worker_.Post([this, cp] {
            std::memcpy(cp->op->dst + cp->offset, cp->staging, cp->length);
            NextFromDevice(*cp->op, *cp, true);
          });
          continue;
        }
        if (c.status.ok()) {
          std::memcpy(op.dst + chunk.offset, chunk.staging, chunk.length);
        }
        NextFromDevice(op, chunk, c.status.ok());
        continue;
      }
    }
    ChunkDone(op);
  }
  DrainOverflow(q);
  in_completion_.fetch_sub(1, std::memory_order_release);
}

void Engine::NextFromDevice(Op& op, Chunk& chunk, bool ok) {
  char* buf = chunk.staging;
  chunk.staging = nullptr;
  Chunk* next = nullptr;
  uint64_t abandoned = 0;
  {
    MutexLock lock(&op.mu);
    const uint32_t n = static_cast<uint32_t>(op.chunks.size());
    if (!ok || !op.error.ok() || closing_.load(std::memory_order_acquire)) {
      if (op.error.ok()) {
        op.error = absl::CancelledError(
            "the transfer engine shut down during the transfer");
      }
      abandoned = n - op.next_chunk;
      op.next_chunk = n;
    } else if (op.next_chunk < n) {
      next = &op.chunks[op.next_chunk++];
    }
  }
  if (next != nullptr) {
    next->staging = buf;
    SubmitChunk(op, *next, region_windows_[op.device],
                reinterpret_cast<uintptr_t>(buf) -
                    reinterpret_cast<uintptr_t>(region_->base()));
  } else {
    ReleaseStaging(buf, op.staging_chunk);
  }
  ChunkDone(op, 1 + abandoned);
}

void Engine::ChunkDone(Op& op, uint64_t n) {
  if (op.outstanding.fetch_sub(n, std::memory_order_acq_rel) == n) {
    FinishOp(op);
  }
}

void Engine::FinishOp(Op& op) {
  if (op.window != kInvalidHostWindow || !op.lease.segments.empty()) {
    // Unregistering and unpinning are system calls: off the DMA thread.
    host_worker_.Post([this, &op] {
      if (op.window != kInvalidHostWindow) {
        absl::Status s = devices_[op.device]->UnregisterHostWindow(op.window);
        if (!s.ok()) LOG(ERROR) << s;
        op.window = kInvalidHostWindow;
      }
      pins_.Unpin(std::move(op.lease));
      op.lease.segments.clear();
      CompleteOp(op);
    });
    return;
  }
  CompleteOp(op);
}

void Engine::CompleteOp(Op& op) {
  std::shared_ptr<Op> keep = std::move(op.self);
  const absl::Status status = op.Error();
  Queue& q = QueueOf(op.device, op.direction);
  q.in_flight.fetch_sub(1, std::memory_order_relaxed);
  if (status.ok()) {
    q.completed.fetch_add(1, std::memory_order_relaxed);
  } else if (absl::IsCancelled(status)) {
    q.cancelled.fetch_add(1, std::memory_order_relaxed);
  } else {
    q.failed.fetch_add(1, std::memory_order_relaxed);
  }
  PathCounters& stats =
      op.kind == OpKind::kDeviceToDevice
          ? d2d_stats_
          : host_stats_[static_cast<int>(op.direction)]
                       [static_cast<int>(op.path)];
  stats.transfers.fetch_add(1, std::memory_order_relaxed);
  if (status.ok()) {
    stats.bytes.fetch_add(op.size, std::memory_order_relaxed);
  } else {
    stats.failed.fetch_add(1, std::memory_order_relaxed);
  }
  const int64_t now = os_->MonotonicNanos();
  stats.busy_ns.fetch_add(now - op.submit_ns, std::memory_order_relaxed);
  if (op.start_ns != 0) {
    stats.active_ns.fetch_add(now - op.start_ns, std::memory_order_relaxed);
  }
  // Not ready for stats from here on (see events_not_ready_).
  events_not_ready_.fetch_sub(1, std::memory_order_acq_rel);
  op.event->Resolve(status);
  // After Resolve: a Deallocate waiting for this operation must not free
  // the buffer (and report it free) while the operation's event is still
  // pending, and a kImmutableOnlyDuringCall caller that returns on
  // host_released must find its event ready.
  ReleaseBufferUse(op.buffer);
  if (op.peer) ReleaseBufferUse(op.peer);
  op.host_released.Notify();
  MutexLock lock(&idle_mu_);
  if (--unfinished_ == 0) idle_cv_.SignalAll();
}

void Engine::CancelUnstarted(const std::shared_ptr<Op>& op,
                             absl::Status status) {
  op->RecordError(status);
  op->self = op;
  QueueOf(op->device, op->direction)
      .in_flight.fetch_add(1, std::memory_order_relaxed);
  CompleteOp(*op);
}

// ---- Shutdown and stats ----------------------------------------------------

void Engine::Shutdown() {
  {
    MutexLock lock(&mu_);
    if (shutting_down_) {
      // A second caller waits for the first to finish.
      while (!shut_down_) shut_down_cv_.Wait(&mu_);
      return;
    }
    shutting_down_ = true;
    closing_.store(true, std::memory_order_release);
  }
  // Wake anyone waiting for staging room: they give up now.
  staging_cv_.SignalAll();
  // Cancel what has not started; stop the workers.
  for (auto& q : queues_) {
    std::deque<std::shared_ptr<Op>> pending;
    {
      MutexLock lock(&q->mu);
      q->stop = true;
      pending.swap(q->pending);
    }
    q->cv.SignalAll();
    for (const std::shared_ptr<Op>& op : pending) {
      CancelUnstarted(op, absl::CancelledError(
                              "the transfer engine shut down before the "
                              "transfer started"));
    }
  }
  for (auto& q : queues_) {
    if (q->worker.joinable()) q->worker.join();
  }
  // Let everything started finish (the devices complete or cancel every
  // descriptor they accepted).
  {
    MutexLock lock(&idle_mu_);
    const int64_t warn_at = os_->MonotonicNanos() + 10'000'000'000;
    bool warned = false;
    while (unfinished_ > 0) {
      if (idle_cv_.WaitUntilMonotonicNanos(&idle_mu_,
                                           os_->MonotonicNanos() +
                                               100'000'000) &&
          !warned && os_->MonotonicNanos() > warn_at) {
        warned = true;
        LOG(WARNING) << "Transfer engine shutdown: still waiting for "
                     << unfinished_ << " operations to finish";
      }
    }
  }
  // ... and for the DMA thread that finished the last one to leave
  // OnDmaComplete (no new delivery can come: nothing is in flight).
  while (in_completion_.load(std::memory_order_acquire) > 0) {
    std::this_thread::yield();
  }
  // Free the device memory nobody deallocated.
  std::vector<std::shared_ptr<Allocation>> live;
  {
    MutexLock lock(&mu_);
    for (auto& [ptr, a] : live_) live.push_back(a);
  }
  for (const auto& a : live) FreeAllocation(a);
  for (size_t i = 0; i < devices_.size(); ++i) {
    devices_[i]->SetCompletionSink(nullptr);
    if (i < region_windows_.size()) {
      absl::Status s = devices_[i]->UnregisterHostWindow(region_windows_[i]);
      if (!s.ok()) LOG(ERROR) << s;
    }
  }
  region_windows_.clear();
  callbacks_.Drain();
  if (trace_) {
    absl::Status s = trace_->Write();
    if (s.ok()) {
      LOG(INFO) << "Wrote the transfer trace (" << trace_->recorded()
                << " records"
                << (trace_->dropped() > 0
                        ? absl::StrCat(", ", trace_->dropped(), " dropped")
                        : std::string())
                << ") to " << trace_->path();
    } else {
      LOG(ERROR) << "Writing the transfer trace to " << trace_->path()
                 << " failed: " << s;
    }
  }
  {
    MutexLock lock(&mu_);
    shut_down_ = true;
  }
  shut_down_cv_.SignalAll();
}

TransferEngine::Stats Engine::GetStats() const {
  TransferEngine::Stats s;
  auto copy = [](const PathCounters& c, TransferEngine::PathStats& out) {
    out.transfers = c.transfers.load(std::memory_order_relaxed);
    out.bytes = c.bytes.load(std::memory_order_relaxed);
    out.failed = c.failed.load(std::memory_order_relaxed);
    out.busy_ns = c.busy_ns.load(std::memory_order_relaxed);
    out.active_ns = c.active_ns.load(std::memory_order_relaxed);
  };
  for (int d = 0; d < 2; ++d) {
    for (int p = 0; p < kTransferPathCount; ++p) {
      copy(host_stats_[d][p], s.host[d][p]);
    }
  }
  copy(d2d_stats_, s.device_to_device);
  s.staging_bytes_in_flight =
      staging_in_flight_.load(std::memory_order_relaxed);
  s.peak_staging_bytes = staging_peak_.load(std::memory_order_relaxed);
  s.max_staging_bytes = max_staging_;
  s.staging_waits = staging_waits_.load(std::memory_order_relaxed);
  s.staging_wait_ns = staging_wait_ns_.load(std::memory_order_relaxed);
  s.pinned_over_threshold = pinned_reasons_[0].load(std::memory_order_relaxed);
  s.pinned_region_off = pinned_reasons_[1].load(std::memory_order_relaxed);
  s.pinned_staging_timeout =
      pinned_reasons_[2].load(std::memory_order_relaxed);
  s.pinned_bytes_now = pins_.pinned_bytes();
  {
    MutexLock lock(&mu_);
    s.device_buffers_live = live_.size();
    s.device_bytes_live = live_bytes_;
  }
  s.events_pending = events_not_ready_.load(std::memory_order_acquire);
  s.callbacks_run = callbacks_.executed();
  for (const auto& q : queues_) {
    TransferEngine::QueueStats qs;
    qs.device = q->device;
    qs.direction = q->direction;
    qs.submitted = q->submitted.load(std::memory_order_relaxed);
    qs.completed = q->completed.load(std::memory_order_relaxed);
    qs.failed = q->failed.load(std::memory_order_relaxed);
    qs.cancelled = q->cancelled.load(std::memory_order_relaxed);
    qs.descriptors = q->descriptors.load(std::memory_order_relaxed);
    qs.ring_full = q->ring_full.load(std::memory_order_relaxed);
    qs.in_flight = q->in_flight.load(std::memory_order_relaxed);
    {
      MutexLock lock(&q->mu);
      qs.pending = q->pending.size();
    }
    s.queues.push_back(qs);
  }
  return s;
}

}  // namespace transfer_internal

// ---- Public wrappers ---------------------------------------------------------

int DeviceBuffer::device() const {
  return allocation_ ? allocation_->device : -1;
}
uint64_t DeviceBuffer::size() const {
  return allocation_ ? allocation_->size : 0;
}
uint64_t DeviceBuffer::device_address() const {
  return allocation_ ? allocation_->address : 0;
}

TransferEngine::Config TransferEngine::Config::FromOptions(
    const Options& options) {
  Config config;
  config.trace_file = options.trace_file.value;
  return config;
}

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    std::vector<Device*> devices, PremappedRegion* region, Os* os,
    Config config, std::vector<HostWindowId> region_windows) {
  // Windows handed over are ours: released if Create fails before Start.
  absl::Cleanup release_windows = [&] {
    for (size_t i = 0; i < region_windows.size() && i < devices.size(); ++i) {
      if (devices[i] != nullptr) {
        (void)devices[i]->UnregisterHostWindow(region_windows[i]);
      }
    }
  };
  if (!region_windows.empty() &&
      (region == nullptr || region_windows.size() != devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TransferEngine: ", region_windows.size(), " region windows given for ",
        devices.size(), " devices", region == nullptr ? " and no region" : ""));
  }
  if (devices.empty()) {
    return absl::InvalidArgumentError("TransferEngine: no devices");
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] == nullptr || devices[i]->info().id != static_cast<int>(i)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TransferEngine: device ", i, " is null or not numbered ", i));
    }
  }
  if (config.chunk_bytes == 0 || config.from_device_chunk_bytes == 0 ||
      config.descriptor_bytes == 0 || config.staging_depth < 1 ||
      config.staging_depth > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TransferEngine: chunk_bytes, from_device_chunk_bytes and "
        "descriptor_bytes must be >= 1 and staging_depth in [1, 64] (got ",
        config.chunk_bytes, ", ", config.from_device_chunk_bytes, ", ",
        config.descriptor_bytes, " and ", config.staging_depth, ")"));
  }
  std::array<uint64_t, 2> chunks = {config.chunk_bytes,
                                    config.from_device_chunk_bytes};
  // Chunks and descriptors of whole device blocks (NVMe's logical blocks).
  uint64_t block = 1;
  for (Device* d : devices)
    block = std::max<uint64_t>(block, d->info().block_bytes);
  const auto whole_blocks = [block](uint64_t bytes) {
    return std::max(block, bytes / block * block);
  };
  config.descriptor_bytes = whole_blocks(config.descriptor_bytes);
  uint64_t max_staging = 0;
  if (region != nullptr) {
    for (uint64_t& c : chunks) {
      c = whole_blocks(std::min(c, region->allocator().threshold()));
    }
    const uint64_t chunk = std::max(chunks[0], chunks[1]);
    max_staging = config.max_staging_bytes;
    if (max_staging == 0) {
      max_staging = std::min<uint64_t>(uint64_t{256} << 20,
                                       std::max(region->size() / 4, chunk));
    } else if (max_staging < chunk) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TransferEngine: max_staging_bytes=", max_staging,
          " is below one staging chunk (", chunk, " bytes)"));
    }
  }
  std::move(release_windows).Cancel();
  auto impl = std::make_unique<transfer_internal::Engine>(
      std::move(devices), region, os, std::move(config), chunks, max_staging);
  TPUSHIM_RETURN_IF_ERROR(impl->Start(std::move(region_windows)));
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

TransferEngine::TransferEngine(std::unique_ptr<transfer_internal::Engine> impl)
    : impl_(std::move(impl)) {}

TransferEngine::~TransferEngine() = default;

int TransferEngine::device_count() const { return impl_->device_count(); }

absl::StatusOr<DeviceBuffer> TransferEngine::Allocate(int device,
                                                      uint64_t size) {
  return impl_->Allocate(device, size);
}

absl::StatusOr<Event> TransferEngine::Deallocate(
    const DeviceBuffer& buffer, absl::Span<const Event> wait_for) {
  TPUSHIM_RETURN_IF_ERROR(impl_->CheckWaitFor(wait_for));
  return impl_->Deallocate(buffer, wait_for);
}

absl::StatusOr<Event> TransferEngine::TransferToDevice(
    const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
    uint64_t size, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  TPUSHIM_RETURN_IF_ERROR(impl_->CheckWaitFor(wait_for));
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer_internal::Op> op,
      impl_->NewHostOp(transfer_internal::OpKind::kToDevice, dst, dst_offset,
                       src, size, semantics));
  return impl_->Submit(std::move(op), wait_for);
}

absl::StatusOr<Event> TransferEngine::TransferFromDevice(
    const DeviceBuffer& src, uint64_t src_offset, void* dst, uint64_t size,
    absl::Span<const Event> wait_for, HostBufferSemantics semantics) {
  TPUSHIM_RETURN_IF_ERROR(impl_->CheckWaitFor(wait_for));
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer_internal::Op> op,
      impl_->NewHostOp(transfer_internal::OpKind::kFromDevice, src,
                       src_offset, dst, size, semantics));
  return impl_->Submit(std::move(op), wait_for);
}

absl::StatusOr<Event> TransferEngine::TransferDeviceToDevice(
    const DeviceBuffer& src, uint64_t src_offset, const DeviceBuffer& dst,
    uint64_t dst_offset, uint64_t size, absl::Span<const Event> wait_for) {
  TPUSHIM_RETURN_IF_ERROR(impl_->CheckWaitFor(wait_for));
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer_internal::Op> op,
      impl_->NewDeviceToDeviceOp(src, src_offset, dst, dst_offset, size));
  return impl_->Submit(std::move(op), wait_for);
}

TransferPath TransferEngine::PathFor(const void* host, uint64_t size) const {
  int reason;
  return impl_->PathFor(host, size, &reason);
}

TransferEngine::Stats TransferEngine::GetStats() const {
  return impl_->GetStats();
}

void TransferEngine::Shutdown() { impl_->Shutdown(); }

}  // namespace tpushim
