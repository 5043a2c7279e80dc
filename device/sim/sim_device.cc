#include "device/sim/sim_device.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/region_allocator.h"
#include "common/cpu_relax.h"
#include "common/human_bytes.h"
#include "common/mutex.h"
#include "common/saturating.h"
#include "common/status_macros.h"
#include "common/stream_copy.h"
#include "device/host_window_table.h"
#include "env/fork_guard.h"
#include "logging/log.h"

namespace tpushim {
namespace {

// Nanoseconds of the link model as a count: rounded down, and saturated at
// the top of int64 (which the model reads as "never"); negative is 0.
int64_t ModelNanos(double ns) {
  constexpr double kTop = 9.2e18;  // just below INT64_MAX
  if (!(ns > 0)) return 0;
  return ns >= kTop ? std::numeric_limits<int64_t>::max()
                    : static_cast<int64_t>(ns);
}

// `t` + `d` (both >= 0) without overflow: INT64_MAX at the top.
int64_t ModelTimeAdd(int64_t t, int64_t d) {
  const uint64_t sum =
      SaturatingAdd(static_cast<uint64_t>(t), static_cast<uint64_t>(d));
  return sum > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
             ? std::numeric_limits<int64_t>::max()
             : static_cast<int64_t>(sum);
}

// Cached DMA copies go in bursts of at most this size. glibc's memcpy
// streams larger copies past the cache (non-temporal stores) on machines
// whose threshold is low; a device→host descriptor the host reads next
// (DmaDescriptor::host_reads_next: a staging buffer) should land in the
// host's cache (DDIO), where the host's copy out of it finds it.
constexpr uint64_t kBurstBytes = uint64_t{256} << 10;

void CopyInBursts(char* dst, const char* src, uint64_t n) {
  for (uint64_t done = 0; done < n; done += kBurstBytes) {
    std::memcpy(dst + done, src + done, std::min(kBurstBytes, n - done));
  }
}

// Descriptors at least this long whose destination nothing on the host
// reads next — device memory, or a caller's buffer the transfer hands back
// whole — are copied with non-temporal stores (StreamingCopy): written
// through the cache they cost a read of every destination line first, and
// ran at 0.6 of a one-thread memcpy of 256 MiB on the project's VM
// (docs/performance.md). Shorter ones stay cached: a small transfer's
// bytes are often read back at once (a round trip), and the fence costs
// more than it saves.
constexpr uint64_t kStreamBytes = uint64_t{64} << 10;

void CopyForDma(char* dst, const char* src, uint64_t n, bool host_reads_next) {
  if (host_reads_next || n < kStreamBytes) {
    CopyInBursts(dst, src, n);
  } else {
    StreamingCopy(dst, src, n);
  }
}

// Freed device buffers at least this large give their whole pages back.
constexpr uint64_t kReleaseOnFreeBytes = uint64_t{64} << 20;

// The HBM of every device of one sim:// URL. Immutable after creation;
// device-to-device copies look their peer up here.
class SimCluster {
 public:
  struct Hbm {
    char* base = nullptr;
    uint64_t size = 0;
  };

  SimCluster(Os* os, std::vector<Hbm> hbm) : os_(os), hbm_(std::move(hbm)) {}
  SimCluster(const SimCluster&) = delete;
  SimCluster& operator=(const SimCluster&) = delete;
  ~SimCluster() {
    for (const Hbm& h : hbm_) {
      ForgetForkExclusion(h.base);
      absl::Status s = os_->Munmap(h.base, h.size);
      if (!s.ok()) LOG(ERROR) << "Unmapping simulated HBM failed: " << s;
    }
  }

  size_t size() const { return hbm_.size(); }
  const Hbm& hbm(size_t i) const { return hbm_[i]; }

 private:
  Os* const os_;
  const std::vector<Hbm> hbm_;
};

class SimDevice final : public Device {
 public:
  SimDevice(DeviceInfo info, std::shared_ptr<SimCluster> cluster, Os* os,
            FaultInjector* faults, const SimDeviceOptions& options);
  ~SimDevice() override;

  const DeviceInfo& info() const override { return info_; }
  void SetCompletionSink(DmaCompletionSink* sink) override {
    sink_.store(sink, std::memory_order_release);
  }

  absl::StatusOr<uint64_t> AllocateMemory(uint64_t size) override;
  absl::Status FreeMemory(uint64_t device_address) override;
  uint64_t MemoryInUse() const override {
    return allocator_.GetStats().bytes_in_use;
  }
  DeviceMemoryStats GetMemoryStats() const override {
    return DeviceMemoryStatsOf(allocator_.GetStats(),
                               RegionAllocator::kAlignment);
  }

  absl::StatusOr<HostWindowId> RegisterHostWindow(const void* base,
                                                  uint64_t length) override;
  absl::Status UnregisterHostWindow(HostWindowId window) override;

  size_t Submit(DmaDirection direction,
                absl::Span<const DmaDescriptor> descriptors) override;
  uint32_t InFlight(DmaDirection direction) const override {
    return queues_[static_cast<int>(direction)]->in_flight.load(
        std::memory_order_acquire);
  }
  bool Poll(DmaDirection direction, uint64_t max_length) override;
  void StopModelledDelays() override;
  void Shutdown() override;

 private:
  struct Queue {
    explicit Queue(DmaDirection d, uint32_t entries)
        : direction(d), ring(entries), mask(entries - 1) {}

    const DmaDirection direction;
    std::vector<DmaDescriptor> ring;  // slots [head, tail) hold work
    const uint32_t mask;
    // Accepted and not yet completed (ring slots in use): Submit accepts
    // while this is below the ring size.
    std::atomic<uint32_t> in_flight{0};
    // Bumped by every Submit; idle engines poll it before they sleep.
    std::atomic<uint64_t> submits{0};
    // tail - head, readable without the lock: Poll's quick look.
    std::atomic<uint32_t> waiting{0};
    // Bumped whenever a descriptor's run ends (running drops): an idle
    // engine that saw work it had no room to start looks again.
    std::atomic<uint64_t> runs_ended{0};

    Mutex mu;
    CondVar cv;
    uint64_t head ABSL_GUARDED_BY(mu) = 0;
    uint64_t tail ABSL_GUARDED_BY(mu) = 0;
    int sleeping ABSL_GUARDED_BY(mu) = 0;
    // Descriptors taken and not yet delivered (or, under the link model,
    // not yet copied), by engines and Polls alike: at most dma_engines, so
    // a Poll runs a descriptor only in place of an engine, and with one
    // engine the queue runs and completes its descriptors one at a time,
    // in ring order, whoever runs them.
    int running ABSL_GUARDED_BY(mu) = 0;
    // Descriptors Poll took and has not delivered yet: Shutdown waits.
    int polling ABSL_GUARDED_BY(mu) = 0;
    bool shutdown ABSL_GUARDED_BY(mu) = false;
    int64_t link_free_ns ABSL_GUARDED_BY(mu) = 0;
    // Set (under mu) by StopModelledDelays: no more waiting for the model.
    std::atomic<bool> hurry{false};

    std::vector<std::thread> engines;  // joined by Shutdown
  };

  // A simulated device keeps nothing besides the range.
  struct NoExtra {};

  void EngineLoop(Queue& q, int engine);
  // A descriptor's run ended: one more may start.
  void EndRun(Queue& q, bool polled);
  // Runs `d`, taken from the ring at `now`, and returns its completion;
  // `modelled` (under the link model) sets its end time from the model.
  DmaCompletion Run(const DmaDescriptor& d, int64_t start_ns, bool cancel,
                    bool modelled, int64_t end_ns);
  // Copies the descriptor's bytes (or fails it); returns the status.
  absl::Status Execute(const DmaDescriptor& d);
  // Resolves `window` + `offset` for `length` bytes; OUT_OF_RANGE if not.
  absl::StatusOr<char*> HostAddress(HostWindowId window, uint64_t offset,
                                    uint64_t length) const;
  absl::Status CheckDeviceRange(uint64_t address, uint64_t length,
                                const SimCluster::Hbm& hbm,
                                absl::string_view which) const;
  void Deliver(Queue& q, absl::Span<const DmaCompletion> done);

  // Constant after construction.
  const DeviceInfo info_;
  const std::shared_ptr<SimCluster> cluster_;
  const SimCluster::Hbm hbm_;
  Os* const os_;
  FaultInjector* const faults_;
  const int64_t idle_spin_ns_;
  const double ns_per_byte_;  // link model; 0 = unthrottled
  const int64_t latency_ns_;

  std::atomic<DmaCompletionSink*> sink_{nullptr};
  RegionAllocator allocator_;

  HostWindowTable<NoExtra> windows_;

  std::array<std::unique_ptr<Queue>, kDmaDirectionCount> queues_;
  Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

SimDevice::SimDevice(DeviceInfo info, std::shared_ptr<SimCluster> cluster,
                     Os* os, FaultInjector* faults,
                     const SimDeviceOptions& options)
    : info_(std::move(info)),
      cluster_(std::move(cluster)),
      hbm_(cluster_->hbm(static_cast<size_t>(info_.id))),
      os_(os),
      faults_(faults),
      idle_spin_ns_(options.idle_spin_ns),
      ns_per_byte_(info_.link_gbps > 0 ? 8.0 / info_.link_gbps : 0.0),
      latency_ns_(ModelNanos(info_.latency_us * 1000.0)),
      allocator_(hbm_.base, hbm_.size,
                 RegionAllocator::Config{
                     .kind = RegionAllocator::Kind::kDeviceMemory,
                     .memory_name = absl::StrCat("0x0x", info_.id, "_HBM0"),
                     .threshold = 0,
                     .dump_on_oom = false,
                     .faults = nullptr}),
      windows_(info_.name) {
  for (int d = 0; d < kDmaDirectionCount; ++d) {
    queues_[d] = std::make_unique<Queue>(static_cast<DmaDirection>(d),
                                         info_.ring_entries);
  }
  for (int d = 0; d < kDmaDirectionCount; ++d) {
    Queue& q = *queues_[d];
    for (int e = 0; e < info_.dma_engines; ++e) {
      q.engines.emplace_back([this, &q, e] { EngineLoop(q, e); });
    }
  }
}

SimDevice::~SimDevice() { Shutdown(); }

absl::StatusOr<uint64_t> SimDevice::AllocateMemory(uint64_t size) {
  TPUSHIM_ASSIGN_OR_RETURN(void* p, allocator_.Allocate(size));
  return static_cast<uint64_t>(static_cast<char*>(p) - hbm_.base);
}

absl::Status SimDevice::FreeMemory(uint64_t device_address) {
  if (device_address >= hbm_.size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FreeMemory(0x%x): not a device address of %s (HBM is %s)",
        device_address, info_.name, HumanReadableBytes(hbm_.size)));
  }
  char* p = hbm_.base + device_address;
  const uint64_t size = allocator_.AllocationSize(p);
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FreeMemory(0x%x): not a live allocation of %s (freed twice, or an "
        "address inside a buffer)",
        device_address, info_.name));
  }
  if (size >= kReleaseOnFreeBytes) {
    // Give the whole pages back while the block is still ours, so no
    // allocation can be handed these pages meanwhile.
    const uintptr_t begin =
        (reinterpret_cast<uintptr_t>(p) + 4095) & ~uintptr_t{4095};
    const uintptr_t end =
        (reinterpret_cast<uintptr_t>(p) + size) & ~uintptr_t{4095};
    if (end > begin) {
      absl::Status s = os_->Madvise(reinterpret_cast<void*>(begin), end - begin,
                                    MADV_DONTNEED);
      if (!s.ok()) {
        VLOG(1) << "Releasing freed device memory of " << info_.name
                << " failed: " << s;
      }
    }
  }
  return allocator_.Free(p);
}

absl::StatusOr<HostWindowId> SimDevice::RegisterHostWindow(const void* base,
                                                           uint64_t length) {
  return windows_.Add(base, length, NoExtra{});
}

absl::Status SimDevice::UnregisterHostWindow(HostWindowId window) {
  return windows_.Remove(window).status();
}

absl::StatusOr<char*> SimDevice::HostAddress(HostWindowId window,
                                             uint64_t offset,
                                             uint64_t length) const {
  TPUSHIM_ASSIGN_OR_RETURN(const HostWindowTable<NoExtra>::Window w,
                           windows_.Find(window, offset, length));
  return const_cast<char*>(w.base) + offset;
}

absl::Status SimDevice::CheckDeviceRange(uint64_t address, uint64_t length,
                                         const SimCluster::Hbm& hbm,
                                         absl::string_view which) const {
  if (address > hbm.size || length > hbm.size - address) {
    return absl::OutOfRangeError(absl::StrFormat(
        "DMA fault on %s: %s [0x%x, +%d) lies outside device memory of %d "
        "bytes",
        info_.name, which, address, length, hbm.size));
  }
  return absl::OkStatus();
}

absl::Status SimDevice::Execute(const DmaDescriptor& d) {
  if (d.length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DMA descriptor on ", info_.name, " has length 0"));
  }
  if (faults_ != nullptr) {
    absl::Status injected = faults_->Check(FaultPoint::kDma, [&] {
      return absl::InternalError(absl::StrFormat(
          "DMA error on %s (%s): descriptor 0x%x of %d bytes did not "
          "complete",
          info_.name, DmaDirectionName(d.direction), d.user_data, d.length));
    });
    if (!injected.ok()) {
      // Logged as a device's DMA error would be.
      LOG(ERROR) << injected;
      return injected;
    }
  }
  switch (d.direction) {
    case DmaDirection::kHostToDevice: {
      TPUSHIM_ASSIGN_OR_RETURN(
          char* host, HostAddress(d.host_window, d.host_offset, d.length));
      TPUSHIM_RETURN_IF_ERROR(
          CheckDeviceRange(d.device_address, d.length, hbm_, "destination"));
      CopyForDma(hbm_.base + d.device_address, host, d.length,
                 /*host_reads_next=*/false);
      return absl::OkStatus();
    }
    case DmaDirection::kDeviceToHost: {
      TPUSHIM_ASSIGN_OR_RETURN(
          char* host, HostAddress(d.host_window, d.host_offset, d.length));
      TPUSHIM_RETURN_IF_ERROR(
          CheckDeviceRange(d.device_address, d.length, hbm_, "source"));
      CopyForDma(host, hbm_.base + d.device_address, d.length,
                 d.host_reads_next);
      return absl::OkStatus();
    }
    case DmaDirection::kDeviceToDevice: {
      if (d.peer_device >= cluster_->size()) {
        return absl::OutOfRangeError(absl::StrFormat(
            "DMA fault on %s: peer device %d does not exist (%d devices)",
            info_.name, d.peer_device, cluster_->size()));
      }
      const SimCluster::Hbm& peer = cluster_->hbm(d.peer_device);
      TPUSHIM_RETURN_IF_ERROR(
          CheckDeviceRange(d.device_address, d.length, hbm_, "source"));
      TPUSHIM_RETURN_IF_ERROR(
          CheckDeviceRange(d.peer_address, d.length, peer, "destination"));
      // memmove: a copy within one device may overlap.
      std::memmove(peer.base + d.peer_address, hbm_.base + d.device_address,
                   d.length);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "DMA descriptor on ", info_.name, " has an unknown direction ",
      static_cast<int>(d.direction)));
}

size_t SimDevice::Submit(DmaDirection direction,
                         absl::Span<const DmaDescriptor> descriptors) {
  const int dir = static_cast<int>(direction);
  if (dir < 0 || dir >= kDmaDirectionCount || descriptors.empty()) return 0;
  Queue& q = *queues_[dir];
  size_t accepted;
  bool wake;
  {
    MutexLock lock(&q.mu);
    if (q.shutdown) return 0;
    const uint32_t room = static_cast<uint32_t>(q.ring.size()) -
                          q.in_flight.load(std::memory_order_relaxed);
    accepted = std::min<size_t>(room, descriptors.size());
    for (size_t i = 0; i < accepted; ++i) {
      q.ring[q.tail++ & q.mask] = descriptors[i];
    }
    q.waiting.fetch_add(static_cast<uint32_t>(accepted),
                        std::memory_order_release);
    q.in_flight.fetch_add(static_cast<uint32_t>(accepted),
                          std::memory_order_relaxed);
    wake = accepted > 0 && q.sleeping > 0;
  }
  if (accepted > 0) q.submits.fetch_add(1, std::memory_order_release);
  if (wake) {
    if (accepted > 1) {
      q.cv.SignalAll();
    } else {
      q.cv.Signal();
    }
  }
  return accepted;
}

void SimDevice::Deliver(Queue& q, absl::Span<const DmaCompletion> done) {
  // Free the ring slots first: the sink may submit again from inside.
  q.in_flight.fetch_sub(static_cast<uint32_t>(done.size()),
                        std::memory_order_acq_rel);
  DmaCompletionSink* sink = sink_.load(std::memory_order_acquire);
  if (sink != nullptr) sink->OnDmaComplete(q.direction, done);
}

void SimDevice::EngineLoop(Queue& q, int engine) {
  {
    const std::string name = absl::StrFormat(
        "dma%d-%s%d", info_.id, DmaDirectionName(q.direction), engine);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  }
  // Executed descriptors waiting for their modelled end time, in order.
  std::deque<DmaCompletion> delayed;
  std::vector<DmaCompletion> due;
  // Whether this engine ran a descriptor since it last slept: only then
  // is more work likely soon (woken for one a waiter's Poll took, it
  // sleeps again at once rather than hold a CPU).
  bool ran = false;
  for (;;) {
    // Deliver what is due (everything, once the device stops modelling).
    if (!delayed.empty()) {
      const int64_t now = os_->MonotonicNanos();
      const bool hurry = q.hurry.load(std::memory_order_acquire);
      due.clear();
      while (!delayed.empty() && (hurry || delayed.front().end_ns <= now)) {
        due.push_back(std::move(delayed.front()));
        delayed.pop_front();
      }
      if (!due.empty()) Deliver(q, due);
    }

    // Take the next descriptor, or wait for one (or for the next due time).
    DmaDescriptor d;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    bool have = false;
    bool cancel = false;
    bool modelled = false;
    uint64_t seen = q.submits.load(std::memory_order_acquire);
    const uint64_t seen_ends = q.runs_ended.load(std::memory_order_acquire);
    {
      MutexLock lock(&q.mu);
      if (q.head != q.tail && q.running < info_.dma_engines) {
        d = q.ring[q.head++ & q.mask];
        q.waiting.fetch_sub(1, std::memory_order_relaxed);
        ++q.running;
        have = true;
        cancel = q.shutdown;
        const int64_t now = os_->MonotonicNanos();
        start_ns = now;
        end_ns = now;
        modelled = !cancel && (ns_per_byte_ > 0 || latency_ns_ > 0) &&
                   !q.hurry.load(std::memory_order_relaxed);
        if (modelled) {
          // Saturating: a time past the int64 range is never, not a wrap
          // into the past.
          start_ns = std::max(now, q.link_free_ns);
          q.link_free_ns = ModelTimeAdd(
              start_ns,
              ModelNanos(static_cast<double>(d.length) * ns_per_byte_));
          end_ns = ModelTimeAdd(q.link_free_ns, latency_ns_);
        }
      } else if (q.shutdown && q.head == q.tail) {
        if (delayed.empty()) return;
      }
    }
    if (have) {
      ran = true;
      DmaCompletion c = Run(d, start_ns, cancel, modelled, end_ns);
      if (!delayed.empty() || end_ns > os_->MonotonicNanos()) {
        delayed.push_back(std::move(c));
      } else {
        Deliver(q, {&c, 1});
      }
      EndRun(q, /*polled=*/false);
      continue;
    }

    // Nothing to start. On shutdown, deliver the rest at once: those
    // descriptors already ran.
    {
      bool shutdown;
      {
        MutexLock lock(&q.mu);
        shutdown = q.shutdown;
      }
      if (shutdown) {
        due.assign(std::make_move_iterator(delayed.begin()),
                   std::make_move_iterator(delayed.end()));
        delayed.clear();
        if (!due.empty()) Deliver(q, due);
        continue;
      }
    }

    // Spin a little: a descriptor submitted right after the last one
    // starts without a wake-up.
    const int64_t spin_until =
        ran || !delayed.empty() ? os_->MonotonicNanos() + idle_spin_ns_ : 0;
    bool work = false;
    while (os_->MonotonicNanos() < spin_until) {
      if (q.submits.load(std::memory_order_acquire) != seen ||
          q.runs_ended.load(std::memory_order_acquire) != seen_ends) {
        work = true;
        break;
      }
      if (!delayed.empty() &&
          (q.hurry.load(std::memory_order_acquire) ||
           delayed.front().end_ns <= os_->MonotonicNanos())) {
        work = true;
        break;
      }
      for (int i = 0; i < 16; ++i) CpuRelax();
    }
    if (work) continue;

    MutexLock lock(&q.mu);
    if ((q.head != q.tail && q.running < info_.dma_engines) || q.shutdown ||
        (!delayed.empty() && q.hurry.load(std::memory_order_relaxed))) {
      continue;
    }
    ++q.sleeping;
    if (delayed.empty()) {
      q.cv.Wait(&q.mu);
    } else {
      q.cv.WaitUntilMonotonicNanos(&q.mu, delayed.front().end_ns);
    }
    --q.sleeping;
    ran = false;
  }
}

DmaCompletion SimDevice::Run(const DmaDescriptor& d, int64_t start_ns,
                             bool cancel, bool modelled, int64_t end_ns) {
  absl::Status status =
      cancel ? absl::CancelledError(absl::StrCat(
                   info_.name, " shut down before the descriptor started"))
             : Execute(d);
  if (!cancel && !modelled) end_ns = os_->MonotonicNanos();
  return DmaCompletion{d.user_data, std::move(status), start_ns, end_ns};
}

bool SimDevice::Poll(DmaDirection direction, uint64_t max_length) {
  const int dir = static_cast<int>(direction);
  if (dir < 0 || dir >= kDmaDirectionCount) return false;
  // Under the link model the engines keep the link's time: a descriptor
  // run here would jump the model's queue.
  if (ns_per_byte_ > 0 || latency_ns_ > 0) return false;
  Queue& q = *queues_[dir];
  if (q.waiting.load(std::memory_order_acquire) == 0) return false;
  DmaDescriptor d;
  int64_t start_ns;
  {
    MutexLock lock(&q.mu);
    if (q.shutdown || q.head == q.tail || q.running >= info_.dma_engines) {
      return false;
    }
    const DmaDescriptor& next = q.ring[q.head & q.mask];
    if (next.length > max_length) return false;
    d = next;
    ++q.head;
    q.waiting.fetch_sub(1, std::memory_order_relaxed);
    ++q.running;
    ++q.polling;
    start_ns = os_->MonotonicNanos();
  }
  DmaCompletion c =
      Run(d, start_ns, /*cancel=*/false, /*modelled=*/false, start_ns);
  Deliver(q, {&c, 1});
  EndRun(q, /*polled=*/true);
  return true;
}

void SimDevice::EndRun(Queue& q, bool polled) {
  // Signalled under the lock: once Shutdown sees no poll left it may
  // return and the device go, so nothing here touches `q` after the
  // unlock.
  MutexLock lock(&q.mu);
  --q.running;
  if (polled) --q.polling;
  q.runs_ended.fetch_add(1, std::memory_order_release);
  if ((q.sleeping > 0 && q.head != q.tail) ||
      (polled && q.polling == 0 && q.shutdown)) {
    q.cv.SignalAll();
  }
}

void SimDevice::StopModelledDelays() {
  for (auto& q : queues_) {
    {
      MutexLock lock(&q->mu);
      q->hurry.store(true, std::memory_order_release);
    }
    q->cv.SignalAll();
  }
}

void SimDevice::Shutdown() {
  {
    MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  for (auto& q : queues_) {
    {
      MutexLock lock(&q->mu);
      q->shutdown = true;
    }
    q->cv.SignalAll();
  }
  for (auto& q : queues_) {
    for (std::thread& t : q->engines) t.join();
    q->engines.clear();
    // A descriptor Poll took before the shutdown completes before we
    // return (the sink hears of nothing afterwards).
    MutexLock lock(&q->mu);
    while (q->polling > 0) q->cv.Wait(&q->mu);
  }
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateSimDevices(
    const DeviceUrl& url, Os* os, FaultInjector* faults,
    SimDeviceOptions options, std::vector<int> host_chips) {
  if (url.scheme != DeviceUrl::Scheme::kSim) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateSimDevices: \"", url.text, "\" is not sim://"));
  }
  if (options.ring_entries == 0 || options.ring_entries > 65536 ||
      (options.ring_entries & (options.ring_entries - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulated device ring of ", options.ring_entries,
                     " entries: must be a power of two in [1, 65536]"));
  }
  if (host_chips.empty()) {
    for (int i = 0; i < url.devices; ++i) host_chips.push_back(i);
  }
  const int count = static_cast<int>(host_chips.size());
  std::vector<SimCluster::Hbm> hbm;
  auto unmap_all = [&] {
    for (const SimCluster::Hbm& h : hbm) {
      ForgetForkExclusion(h.base);
      (void)os->Munmap(h.base, h.size);
    }
  };
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<void*> p =
        os->Mmap(nullptr, url.hbm_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!p.ok()) {
      unmap_all();
      return absl::Status(
          p.status().code(),
          absl::StrCat("Reserving ", HumanReadableBytes(url.hbm_bytes),
                       " of address space for the HBM of simulated device ", i,
                       " (", url.text, ") failed: ", p.status().message()));
    }
    hbm.push_back({static_cast<char*>(*p), url.hbm_bytes});
    // Device memory: a fork() child has no business with it, and sharing it
    // would make the parent's DMA writes copy pages while the child lives.
    // Tolerated: the device works, forks are only slower.
    absl::Status excluded =
        ExcludeFromFork(*os, *p, url.hbm_bytes,
                        absl::StrCat("the HBM of simulated device ", i));
    if (!excluded.ok()) {
      LOG(WARNING) << excluded
                   << "; a fork() child will share it copy-on-write";
    }
    // Backed by huge pages as it is written (still lazily: 2 MiB at a
    // time, on first touch): the DMA engines stream whole descriptors to
    // and from it, and over 4 KiB pages such copies ran at about 0.9 of
    // the same copy between huge pages (docs/performance.md). Tolerated:
    // the device works on 4 KiB pages too.
    absl::Status huge = os->Madvise(*p, url.hbm_bytes, MADV_HUGEPAGE);
    if (!huge.ok()) {
      LOG(INFO) << "The HBM of simulated device " << i
                << " stays on 4 KiB pages: " << huge;
    }
  }
  auto cluster = std::make_shared<SimCluster>(os, std::move(hbm));
  const int node = os->NumaNodeOfCurrentCpu();
  std::vector<std::unique_ptr<Device>> devices;
  for (int i = 0; i < count; ++i) {
    DeviceInfo info;
    info.id = i;
    // The host chip is named where it differs from the device number.
    info.name = host_chips[i] == i ? absl::StrCat("sim:", i)
                                   : absl::StrCat("sim:", i, " (host chip ",
                                                  host_chips[i], ")");
    info.host_chip = host_chips[i];
    info.backend = "sim";
    info.hbm_bytes = url.hbm_bytes;
    info.dma_engines = url.dma_engines;
    info.ring_entries = options.ring_entries;
    info.numa_node = node;
    info.link_gbps = url.link_gbps;
    info.latency_us = url.latency_us;
    devices.push_back(std::make_unique<SimDevice>(std::move(info), cluster, os,
                                                  faults, options));
  }
  return devices;
}

}  // namespace tpushim
