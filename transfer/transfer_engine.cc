#include "transfer/transfer_engine.h"

#include <pthread.h>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/human_bytes.h"
#include "common/status_macros.h"
#include "env/fork_guard.h"
#include "logging/log.h"
#include "transfer/engine.h"

namespace tpushim {

absl::string_view HostBufferSemanticsName(HostBufferSemantics semantics) {
  switch (semantics) {
    case HostBufferSemantics::kImmutableOnlyDuringCall:
      return "immutable_only_during_call";
    case HostBufferSemantics::kImmutableUntilTransferCompletes:
      return "immutable_until_transfer_completes";
    case HostBufferSemantics::kImmutableZeroCopy:
      return "immutable_zero_copy";
    case HostBufferSemantics::kMutableZeroCopy:
      return "mutable_zero_copy";
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

}  // namespace

Engine::Engine(std::vector<Device*> devices, PremappedRegion* region, Os* os,
               TransferEngine::Config config,
               std::array<uint64_t, 2> chunk_bytes, uint64_t max_staging)
    : serial_(g_engine_serial.fetch_add(1) + 1),
      devices_(std::move(devices)),
      region_(region),
      os_(os),
      config_(std::move(config)),
      chunk_bytes_(chunk_bytes),
      max_staging_(max_staging),
      threshold_(region == nullptr ? 0 : region->allocator().threshold()),
      origin_ns_(os->MonotonicNanos()),
      owner_pid_(CurrentProcessId()),
      poll_gate_(std::make_shared<PollGate>(devices_)),
      caller_events_(std::make_shared<CallerEventHub>(&callbacks_, this)),
      pins_(os) {
  {
    MutexLock lock(&mu_);
    memory_use_.resize(devices_.size());
  }
  for (size_t i = 0; i < devices_.size(); ++i) {
    host_workers_.push_back(
        std::make_unique<HostWorker>(absl::StrCat("tpushim-host", i)));
  }
  if (!config_.trace_file.empty()) {
    trace_ =
        std::make_unique<TraceRecorder>(config_.trace_file, os_, origin_ns_);
  }
}

absl::Status Engine::Start(std::vector<HostWindowId> region_windows) {
  memory_profile_ = config_.memory_profile;
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
                         dev->info().name, " failed: ", w.status().message()));
      }
      region_windows_.push_back(*w);
    }
    if (trace_) trace_->NameDevice(static_cast<int>(i), dev->info().name);
  }
  if (region_ == nullptr && config_.bounce_pool_bytes > 0) {
    TPUSHIM_RETURN_IF_ERROR(StartBouncePool());
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
      const std::string name = absl::StrFormat("xfer%d-%s", qp->device,
                                               DmaDirectionName(qp->direction));
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      WorkerLoop(*qp);
    });
  }
  return absl::OkStatus();
}

absl::Status Engine::StartBouncePool() {
  TPUSHIM_ASSIGN_OR_RETURN(
      std::unique_ptr<BouncePool> pool,
      BouncePool::Create(os_, config_.bounce_pool_bytes, config_.bounce_mlock));
  std::vector<HostWindowId> windows;
  for (Device* dev : devices_) {
    absl::StatusOr<HostWindowId> w =
        dev->RegisterHostWindow(pool->base(), pool->size());
    if (!w.ok()) {
      for (size_t j = 0; j < windows.size(); ++j) {
        (void)devices_[j]->UnregisterHostWindow(windows[j]);
      }
      return absl::Status(
          w.status().code(),
          absl::StrCat("Registering the transfer engine's bounce pool with ",
                       dev->info().name, " failed: ", w.status().message()));
    }
    windows.push_back(*w);
  }
  if (!pool->fork_error().ok()) {
    LOG(WARNING) << pool->fork_error()
                 << "; a fork() child will share the bounce pool copy-on-write";
  }
  if (!pool->lock_error().ok()) {
    LOG(WARNING) << "mlock() of the transfer engine's "
                 << HumanReadableBytes(pool->size())
                 << " bounce pool failed: " << pool->lock_error()
                 << "; small transfers go through it unlocked "
                    "(TPUSHIM_MLOCK=required makes this an error)";
  }
  LOG(INFO) << "Premapped region off: small transfers (up to "
            << HumanReadableBytes(config_.bounce_max_bytes)
            << ") are staged through a " << HumanReadableBytes(pool->size())
            << " " << (pool->locked() ? "pinned" : "unlocked")
            << " bounce pool instead of pinning the caller's memory";
  bounce_ = std::move(pool);
  bounce_windows_ = std::move(windows);
  return absl::OkStatus();
}

Engine::~Engine() { Shutdown(); }

absl::Status Engine::CheckOpen() const {
  if (ForkedChildOf(owner_pid_)) {
    return ForkedChildError("This System's transfer engine", owner_pid_);
  }
  if (closing_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        "the transfer engine has been shut down");
  }
  return absl::OkStatus();
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
  // From here on the DMA threads alone run descriptors: the devices go
  // after this, and a waiter's poll must not reach them then.
  poll_gate_->Close();
  // Whatever a device model still holds completes now, and nothing more
  // is timed: a system being destroyed never sleeps out modelled time.
  // First thing, before the workers are joined: a worker may be inside a
  // started staged transfer, whose copier waits for its chunks' DMA.
  for (Device* device : devices_) device->StopModelledDelays();
  // Fail the caller events not set (and the chunked transfers without
  // their last chunk): nothing set after this could reach the engine, and
  // the operations waiting for them are cancelled below.
  caller_events_->Close(
      absl::CancelledError("the system shut down before the event was set"));
  // Wake anyone waiting for staging room: they give up now.
  staging_cv_.SignalAll();
  // Cancel what has not started; stop the workers.
  for (auto& q : queues_) {
    std::vector<std::shared_ptr<Op>> pending;
    {
      MutexLock lock(&q->mu);
      q->stop = true;
      for (auto* ops : {&q->waiting, &q->ready}) {
        for (auto& [id, op] : *ops) pending.push_back(std::move(op));
        ops->clear();
      }
    }
    // In submission order, whether waiting or ready.
    std::sort(pending.begin(), pending.end(),
              [](const std::shared_ptr<Op>& a, const std::shared_ptr<Op>& b) {
                return a->id < b->id;
              });
    q->cv.SignalAll();
    for (const std::shared_ptr<Op>& op : pending) {
      CancelUnstarted(
          op, absl::CancelledError("the transfer engine shut down before the "
                                   "transfer started"));
    }
  }
  for (auto& q : queues_) {
    if (q->worker.joinable()) q->worker.join();
  }
  // Let everything started finish (the devices complete or cancel every
  // descriptor they accepted), at the speed of the copies alone.
  {
    MutexLock lock(&idle_mu_);
    const int64_t warn_at = os_->MonotonicNanos() + 10'000'000'000;
    bool warned = false;
    while (unfinished_ > 0) {
      if (idle_cv_.WaitUntilMonotonicNanos(
              &idle_mu_, os_->MonotonicNanos() + 100'000'000) &&
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
  // Nothing uses them now: unmap and unpin what callers left registered.
  ReleaseRegistrations();
  for (size_t i = 0; i < devices_.size(); ++i) {
    devices_[i]->SetCompletionSink(nullptr);
    if (i < region_windows_.size()) {
      absl::Status s = devices_[i]->UnregisterHostWindow(region_windows_[i]);
      if (!s.ok()) LOG(ERROR) << s;
    }
  }
  region_windows_.clear();
  for (size_t i = 0; i < bounce_windows_.size(); ++i) {
    absl::Status s = devices_[i]->UnregisterHostWindow(bounce_windows_[i]);
    if (!s.ok()) LOG(ERROR) << s;
  }
  bounce_windows_.clear();
  callbacks_.Drain();
  if (memory_profile_) {
    absl::Status s = memory_profile_->Close();
    if (s.ok()) {
      LOG(INFO) << "Wrote the memory profile (" << memory_profile_->records()
                << " records) to " << memory_profile_->path();
    } else {
      LOG(ERROR) << "The memory profile " << memory_profile_->path()
                 << " is incomplete: " << s;
    }
  }
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
  const auto pinned = [this](PinReason r) {
    return pinned_reasons_[static_cast<int>(r)].load(std::memory_order_relaxed);
  };
  s.pinned_over_threshold = pinned(PinReason::kOverThreshold);
  s.pinned_region_off = pinned(PinReason::kRegionOff);
  s.pinned_staging_timeout = pinned(PinReason::kStagingTimeout);
  s.pinned_not_premapped = pinned(PinReason::kNotPremapped);
  s.staged_misaligned = staged_misaligned_.load(std::memory_order_relaxed);
  s.staged_bounce = staged_bounce_.load(std::memory_order_relaxed);
  if (bounce_ != nullptr) {
    s.bounce_pool_bytes = bounce_->size();
    s.bounce_pool_locked = bounce_->locked();
  }
  s.pinned_bytes_now = pins_.pinned_bytes();
  for (int d = 0; d < 2; ++d) {
    s.zero_copy_registered_transfers[d] =
        registered_transfers_[d].load(std::memory_order_relaxed);
    s.zero_copy_registered_bytes[d] =
        registered_bytes_[d].load(std::memory_order_relaxed);
  }
  {
    MutexLock lock(&reg_mu_);
    s.registrations_live = registrations_.size();
    s.registered_bytes = registered_bytes_now_;
  }
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
      qs.pending = q->waiting.size() + q->ready.size();
    }
    s.queues.push_back(qs);
  }
  return s;
}

std::vector<DeviceMemoryUse> Engine::GetMemoryUse() const {
  MutexLock lock(&mu_);
  return memory_use_;
}

}  // namespace transfer_internal

// ---- Public wrappers
// ---------------------------------------------------------

int DeviceBuffer::device() const {
  return allocation_ ? allocation_->device : -1;
}
uint64_t DeviceBuffer::size() const {
  return allocation_ ? allocation_->size : 0;
}
uint64_t DeviceBuffer::device_address() const {
  return allocation_ ? allocation_->address : 0;
}
std::string DeviceBuffer::shape() const {
  return allocation_ && allocation_->shape ? allocation_->shape->text
                                           : std::string();
}
uint64_t DeviceBuffer::unpadded_size() const {
  return allocation_ ? allocation_->unpadded : 0;
}
uint64_t DeviceBuffer::host_size() const {
  if (!allocation_) return 0;
  return allocation_->shape ? allocation_->shape->host_bytes
                            : allocation_->size;
}
std::string DeviceBuffer::label() const {
  return allocation_ ? allocation_->label : std::string();
}
std::string DeviceBuffer::op_metadata() const {
  return allocation_ ? allocation_->op_metadata : std::string();
}

TransferEngine::Config TransferEngine::Config::FromOptions(
    const Options& options) {
  Config config;
  config.trace_file = options.trace_file.value;
  config.bounce_mlock = options.mlock.value;
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
      config.descriptor_bytes == 0 || config.pinned_piece_bytes == 0 ||
      config.staging_depth < 1 || config.staging_depth > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TransferEngine: chunk_bytes, from_device_chunk_bytes, "
        "descriptor_bytes and pinned_piece_bytes must be >= 1 and "
        "staging_depth in [1, 64] (got ",
        config.chunk_bytes, ", ", config.from_device_chunk_bytes, ", ",
        config.descriptor_bytes, ", ", config.pinned_piece_bytes, " and ",
        config.staging_depth, ")"));
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
  config.pinned_piece_bytes = whole_blocks(config.pinned_piece_bytes);
  uint64_t max_staging = 0;
  if (region == nullptr && config.bounce_pool_bytes > 0) {
    // Bounce pool staging: two buffers per transfer, for a few at once.
    for (uint64_t& c : chunks) {
      c = whole_blocks(std::min(c, config.bounce_pool_bytes / 4));
    }
    if (config.bounce_max_bytes == 0 ||
        std::max(chunks[0], chunks[1]) > config.bounce_pool_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TransferEngine: bounce_pool_bytes=", config.bounce_pool_bytes,
          " must hold a staging chunk of whole device blocks (",
          std::max(chunks[0], chunks[1]),
          " bytes), and bounce_max_bytes must be >= 1 (got ",
          config.bounce_max_bytes, ")"));
    }
  }
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
      return absl::InvalidArgumentError(
          absl::StrCat("TransferEngine: max_staging_bytes=", max_staging,
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

absl::StatusOr<DeviceBuffer> TransferEngine::Allocate(
    int device, const DeviceBufferSpec& spec) {
  return impl_->Allocate(device, spec);
}

absl::StatusOr<DeviceBuffer> TransferEngine::Allocate(int device,
                                                      uint64_t size) {
  return impl_->Allocate(device, size);
}

absl::StatusOr<Event> TransferEngine::Deallocate(
    const DeviceBuffer& buffer, absl::Span<const Event> wait_for) {
  TPUSHIM_RETURN_IF_ERROR(impl_->CheckWaitFor(wait_for));
  return impl_->Deallocate(buffer, wait_for);
}

namespace {

// The operation of a host→device transfer, for TransferToDevice and
// TransferToDeviceWithEvents (which differ only in how it is submitted).
absl::StatusOr<std::shared_ptr<transfer_internal::Op>> ToDeviceOp(
    transfer_internal::Engine& engine, const void* src, const DeviceBuffer& dst,
    uint64_t dst_offset, uint64_t size, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  TPUSHIM_RETURN_IF_ERROR(engine.CheckWaitFor(wait_for));
  return engine.NewHostOp(transfer_internal::OpKind::kToDevice, dst, dst_offset,
                          src, size, semantics);
}

// The same for the whole array of a shaped buffer.
absl::StatusOr<std::shared_ptr<transfer_internal::Op>> ArrayToDeviceOp(
    transfer_internal::Engine& engine, const void* src, const DeviceBuffer& dst,
    absl::Span<const Event> wait_for, HostBufferSemantics semantics) {
  TPUSHIM_RETURN_IF_ERROR(engine.CheckWaitFor(wait_for));
  return engine.NewArrayOp(transfer_internal::OpKind::kToDevice, dst, src,
                           semantics);
}

}  // namespace

absl::StatusOr<Event> TransferEngine::TransferToDevice(
    const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
    uint64_t size, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer_internal::Op> op,
      ToDeviceOp(*impl_, src, dst, dst_offset, size, wait_for, semantics));
  return impl_->Submit(std::move(op), wait_for);
}

absl::StatusOr<Event> TransferEngine::TransferFromDevice(
    const DeviceBuffer& src, uint64_t src_offset, void* dst, uint64_t size,
    absl::Span<const Event> wait_for, HostBufferSemantics semantics) {
  TPUSHIM_RETURN_IF_ERROR(impl_->CheckWaitFor(wait_for));
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer_internal::Op> op,
      impl_->NewHostOp(transfer_internal::OpKind::kFromDevice, src, src_offset,
                       dst, size, semantics));
  return impl_->Submit(std::move(op), wait_for);
}

absl::StatusOr<Event> TransferEngine::TransferArrayToDevice(
    const void* src, const DeviceBuffer& dst, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer_internal::Op> op,
      ArrayToDeviceOp(*impl_, src, dst, wait_for, semantics));
  return impl_->Submit(std::move(op), wait_for);
}

absl::StatusOr<Event> TransferEngine::TransferArrayFromDevice(
    const DeviceBuffer& src, void* dst, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  TPUSHIM_RETURN_IF_ERROR(impl_->CheckWaitFor(wait_for));
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer_internal::Op> op,
      impl_->NewArrayOp(transfer_internal::OpKind::kFromDevice, src, dst,
                        semantics));
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

absl::StatusOr<TransferEvents> TransferEngine::TransferToDeviceWithEvents(
    const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
    uint64_t size, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer_internal::Op> op,
      ToDeviceOp(*impl_, src, dst, dst_offset, size, wait_for, semantics));
  return impl_->SubmitWithRelease(std::move(op), wait_for);
}

absl::StatusOr<TransferEvents> TransferEngine::TransferArrayToDeviceWithEvents(
    const void* src, const DeviceBuffer& dst, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer_internal::Op> op,
      ArrayToDeviceOp(*impl_, src, dst, wait_for, semantics));
  return impl_->SubmitWithRelease(std::move(op), wait_for);
}

absl::StatusOr<CallerEvent> TransferEngine::CreateEvent() {
  return impl_->CreateEvent();
}

absl::StatusOr<Event> TransferEngine::BufferReadyEvent(
    const DeviceBuffer& buffer) {
  return impl_->BufferReadyEvent(buffer);
}

absl::Status TransferEngine::BeginChunkedTransfer(const DeviceBuffer& dst) {
  return impl_->BeginChunkedTransfer(dst);
}

absl::StatusOr<TransferEvents> TransferEngine::TransferChunk(
    const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
    uint64_t size, bool is_last, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  TPUSHIM_RETURN_IF_ERROR(impl_->CheckWaitFor(wait_for));
  return impl_->TransferChunk(src, dst, dst_offset, size, is_last, wait_for,
                              semantics);
}

absl::Status TransferEngine::AbortChunkedTransfer(const DeviceBuffer& dst,
                                                  absl::Status error) {
  return impl_->AbortChunkedTransfer(dst, std::move(error));
}

absl::StatusOr<uint64_t> TransferEngine::RegisterHostMemory(const void* data,
                                                            uint64_t size) {
  return impl_->RegisterHostMemory(data, size);
}

absl::Status TransferEngine::UnregisterHostMemory(uint64_t id) {
  return impl_->UnregisterHostMemory(id);
}

TransferPath TransferEngine::PathFor(const void* host, uint64_t size) const {
  return impl_->PathFor(host, size, /*device=*/0).path;
}

TransferEngine::Stats TransferEngine::GetStats() const {
  return impl_->GetStats();
}

HostRange TransferEngine::ClassifyHostRange(const void* host,
                                            uint64_t size) const {
  return impl_->ClassifyHostRange(host, size);
}

std::vector<DeviceMemoryUse> TransferEngine::GetMemoryUse() const {
  return impl_->GetMemoryUse();
}

void TransferEngine::Shutdown() { impl_->Shutdown(); }

}  // namespace tpushim
