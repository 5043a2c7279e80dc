#include "tpushim/system.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/premapped_region.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "device/devices.h"
#include "driver/memory_spaces.h"
#include "driver/system_internal.h"
#include "env/chips.h"
#include "env/fault_injection.h"
#include "env/fork_guard.h"
#include "env/options.h"
#include "logging/log.h"
#include "transfer/transfer_engine.h"

namespace tpushim {

// What a PinnedHostBuffer returns its memory to. Shared by the system and
// its buffers, so a buffer outliving its system (a REQUIRES violation)
// finds the region gone instead of freeing into unmapped memory.
struct PinnedHostBuffer::Owner {
  // The process whose region the buffers are in (a fork() child has none).
  const pid_t pid = CurrentProcessId();
  Mutex mu;
  RegionAllocator* allocator ABSL_GUARDED_BY(mu) = nullptr;
};

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : owner_(std::move(other.owner_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(
    PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::move(other.owner_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedHostBuffer::~PinnedHostBuffer() { Reset(); }

void PinnedHostBuffer::Reset() {
  if (data_ != nullptr && owner_ != nullptr && ForkedChildOf(owner_->pid)) {
    // Inherited through fork(): the region stayed with the parent, and a
    // lock held there at fork() would never be released here.
    data_ = nullptr;
  }
  if (data_ != nullptr && owner_ != nullptr) {
    MutexLock lock(&owner_->mu);
    if (owner_->allocator != nullptr) {
      absl::Status s = owner_->allocator->Free(data_);
      if (!s.ok()) LOG(ERROR) << "Freeing a pinned host buffer: " << s;
    } else {
      LOG(ERROR) << "A pinned host buffer of " << size_
                 << " bytes outlived its tpushim::System; its memory went "
                    "with the system's premapped region";
    }
  }
  owner_.reset();
  data_ = nullptr;
  size_ = 0;
}

// What a HostRegistration unregisters through. Shared by the system and
// its registrations: a registration outliving its system finds no engine
// (the system released it) instead of calling into a destroyed one.
struct HostRegistration::Owner {
  const pid_t pid = CurrentProcessId();
  // Shared by Unregister calls; ~System takes it exclusively to clear
  // `engine`, after the unregisters running finish.
  SharedMutex mu;
  TransferEngine* engine ABSL_GUARDED_BY(mu) = nullptr;
};

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : owner_(std::move(other.owner_)),
      id_(std::exchange(other.id_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

HostRegistration& HostRegistration::operator=(
    HostRegistration&& other) noexcept {
  if (this != &other) {
    absl::Status s = Unregister();
    if (!s.ok()) LOG(ERROR) << "Unregistering host memory: " << s;
    owner_ = std::move(other.owner_);
    id_ = std::exchange(other.id_, 0);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

HostRegistration::~HostRegistration() {
  if (owner_ != nullptr && ForkedChildOf(owner_->pid)) return;  // the parent's
  absl::Status s = Unregister();
  if (!s.ok()) LOG(ERROR) << "Unregistering host memory: " << s;
}

absl::Status HostRegistration::Unregister() {
  if (data_ == nullptr || owner_ == nullptr) return absl::OkStatus();
  if (ForkedChildOf(owner_->pid)) {
    return ForkedChildError("This host memory registration", owner_->pid);
  }
  const std::shared_ptr<Owner> owner = std::move(owner_);
  const uint64_t id = std::exchange(id_, 0);
  data_ = nullptr;
  size_ = 0;
  ReaderMutexLock lock(&owner->mu);
  if (owner->engine == nullptr) return absl::OkStatus();  // system gone
  absl::Status s = owner->engine->UnregisterHostMemory(id);
  // FAILED_PRECONDITION: the system is being destroyed, and its engine's
  // shutdown released the registration (or is releasing it).
  return absl::IsFailedPrecondition(s) ? absl::OkStatus() : s;
}

// Start-up progress: told by Create and, for a region premapped in the
// background, by the premapping thread after Create returned; read by
// System::premap_progress. Reports reach the callback at most every 50 ms
// while premapping, always with the last byte, and once with kDone: when
// start-up or premapping ends, or, for a callback that does not go on
// after Create (kCreateReturns), when Create returns, after which the
// callback is gone.
class StartupReporter {
 public:
  StartupReporter(Os* os, int64_t start_ns, StartupProgressCallback callback)
      : os_(os), start_ns_(start_ns), callback_(std::move(callback)) {}

  // Calls are never concurrent (Create, then the premapping thread).
  void Premapping(uint64_t done, uint64_t total) {
    const int64_t now = os_->MonotonicNanos();
    bool tell;
    {
      MutexLock lock(&mu_);
      done_ = done;
      total_ = total;
      tell = done >= total || last_report_ns_ == 0 ||
             now - last_report_ns_ >= 50'000'000;
      if (tell) last_report_ns_ = now;
    }
    if (tell) {
      Tell(StartupProgress{.phase = StartupProgress::Phase::kPremapping,
                           .done_bytes = done,
                           .total_bytes = total,
                           .elapsed = absl::Nanoseconds(now - start_ns_)});
    }
  }
  // Once: start-up (or premapping behind it) has ended.
  void Done() {
    StartupProgress p;
    {
      MutexLock lock(&mu_);
      if (end_ns_ != 0) return;
      end_ns_ = os_->MonotonicNanos();
      p = SnapshotLocked();
    }
    Tell(p);
  }
  // Create returns while premapping goes on behind it, and the callback
  // was not asked to go on: its last call, kDone with the bytes premapped
  // so far, then the callback is destroyed. A premapping thread's call
  // in progress finishes first; later ones find no callback.
  // Premapping that ended before Create returns has made the kDone call.
  void CreateReturning() {
    MutexLock call(&call_mu_);
    if (callback_ != nullptr && !told_done_) {
      StartupProgress p = Snapshot();
      p.phase = StartupProgress::Phase::kDone;
      callback_(p);
    }
    callback_ = nullptr;
  }
  StartupProgress Snapshot() const {
    MutexLock lock(&mu_);
    return SnapshotLocked();
  }

 private:
  void Tell(const StartupProgress& p) {
    MutexLock call(&call_mu_);
    if (callback_) callback_(p);
    if (p.phase == StartupProgress::Phase::kDone) told_done_ = true;
  }
  StartupProgress SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t end = end_ns_ != 0 ? end_ns_ : os_->MonotonicNanos();
    return StartupProgress{.phase = end_ns_ != 0
                                        ? StartupProgress::Phase::kDone
                                        : StartupProgress::Phase::kPremapping,
                           .done_bytes = done_,
                           .total_bytes = total_,
                           .elapsed = absl::Nanoseconds(end - start_ns_)};
  }

  Os* const os_;
  const int64_t start_ns_;
  // Held while the callback runs (it never calls into tpushim), so that
  // CreateReturning cannot drop it mid-call.
  Mutex call_mu_;
  StartupProgressCallback callback_ ABSL_GUARDED_BY(call_mu_);
  bool told_done_ ABSL_GUARDED_BY(call_mu_) = false;  // kDone was the last
  mutable Mutex mu_;
  int64_t last_report_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t end_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
};

struct System::Impl {
  // The process that created the system; a fork() child only abandons it.
  const pid_t pid = CurrentProcessId();
  Options options;
  std::unique_ptr<StartupReporter> startup;
  // From TPUSHIM_FAULTS; null when SystemFactory's caller injects faults.
  std::unique_ptr<FaultInjector> faults;
  std::unique_ptr<FaultInjectingOs> os;
  // Let go last, once the devices are closed.
  ChipOwnership chips;
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<DeviceDescription> descriptions;
  std::unique_ptr<PremappedRegion> region;
  std::unique_ptr<TransferEngine> engine;
  std::unique_ptr<MemorySpaces> memories;
  std::shared_ptr<PinnedHostBuffer::Owner> owner =
      std::make_shared<PinnedHostBuffer::Owner>();
  std::shared_ptr<HostRegistration::Owner> registrations =
      std::make_shared<HostRegistration::Owner>();
  absl::Duration init_time;

  ~Impl() {
    // Premapping behind the caller first (it extends the devices' windows
    // of the region), then the engine (it drains into the devices and the
    // region), then the region's buffers are orphaned, then devices and
    // region go.
    if (region) region->StopPremapping();
    // The engine's shutdown releases the host memory registrations left
    // (an Unregister running meanwhile finishes, as the transfers it waits
    // for end or are cancelled); then later Unregisters find no engine.
    if (engine) engine->Shutdown();
    // Memory-kind buffers' host bytes go back while the region is alive.
    memories.reset();
    {
      WriterMutexLock lock(&registrations->mu);
      registrations->engine = nullptr;
    }
    engine.reset();
    {
      MutexLock lock(&owner->mu);
      owner->allocator = nullptr;
    }
    region.reset();
    devices.clear();
  }
};

namespace {

std::string DeviceIdList(int n) {
  std::vector<int> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  return absl::StrJoin(ids, ",");
}

// An OS layer over `base` that fails log_open as `spec` says, for logging.
// Logging keeps its Os as long as it is set up, which may be longer than
// any System, so the layer and its injector are kept for the life of the
// process — reachable from here, not leaked. One is made per logging
// set-up with TPUSHIM_FAULTS: once per process, except in tests that set
// logging up again and again.
Os* LogFaultOs(Os* base, const FaultSpec& spec) {
  struct Kept {
    std::unique_ptr<FaultInjector> faults;
    std::unique_ptr<FaultInjectingOs> os;
  };
  static Mutex* const mu = new Mutex();
  static std::vector<Kept>* const kept = new std::vector<Kept>();
  Kept k;
  k.faults = std::make_unique<FaultInjector>(spec);
  k.os = std::make_unique<FaultInjectingOs>(base, k.faults.get());
  Os* os = k.os.get();
  MutexLock lock(mu);
  kept->push_back(std::move(k));
  return os;
}

}  // namespace

absl::StatusOr<std::unique_ptr<System>> SystemFactory::Create(
    const OptionOverrides& overrides, Os* base_os, FaultInjector* faults,
    StartupProgressCallback progress, StartupProgressUntil until) {
  const int64_t start_ns = base_os->MonotonicNanos();
  auto impl = std::make_unique<System::Impl>();
  impl->startup =
      std::make_unique<StartupReporter>(base_os, start_ns, std::move(progress));
  StartupReporter* const startup = impl->startup.get();
  // kDone however Create returns. With premapping behind it, the
  // premapping thread ends it, unless the callback stops with Create.
  bool premapping_behind = false;
  absl::Cleanup done = [&] {
    if (!premapping_behind) {
      startup->Done();
    } else if (until == StartupProgressUntil::kCreateReturns) {
      startup->CreateReturning();
    }
  };
  TPUSHIM_ASSIGN_OR_RETURN(impl->options, ResolveOptions(*base_os, overrides));
  const Options& options = impl->options;

  // Logging is process-wide: set it up unless someone already has, with
  // `log_open` faults of TPUSHIM_FAULTS through an Os of its own. A
  // caller's injector needs none: `base_os` then injects `log_open` itself.
  if (!logging::LoggingInitialized()) {
    Os* log_os = base_os;
    if (faults == nullptr && !options.faults.value.empty()) {
      log_os = LogFaultOs(base_os, options.faults.value);
    }
    TPUSHIM_RETURN_IF_ERROR(
        logging::InitLogging(logging::LogConfig::FromOptions(options), log_os));
  } else if (options.log_dir.source != OptionSource::kDefault ||
             options.min_log_level.source != OptionSource::kDefault ||
             options.stderr_log_level.source != OptionSource::kDefault) {
    LOG(INFO) << "Logging is already set up in this process (directory \""
              << logging::ActiveLogDirectory()
              << "\"); this system's logging settings are not applied";
  }
  // Every setting's resolved value and where it came from, logged once, at
  // INFO (what `tpushim info` shows as a table).
  std::vector<std::string> settings;
  for (const OptionRow& row : DescribeOptions(options)) {
    settings.push_back(absl::StrCat(row.name, "=", row.value, " (",
                                    OptionSourceName(row.source), ")"));
  }
  LOG(INFO) << "tpushim configuration: " << absl::StrJoin(settings, ", ");
  for (const std::string& w : options.warnings) LOG(WARNING) << w;

  FaultInjector* injector = faults;
  Os* os = base_os;
  if (injector == nullptr) {
    impl->faults = std::make_unique<FaultInjector>(options.faults.value);
    impl->os = std::make_unique<FaultInjectingOs>(base_os, impl->faults.get());
    injector = impl->faults.get();
    os = impl->os.get();
  }

  // The chips first: a chip another System holds is refused before
  // anything is mapped, opened or premapped.
  const std::vector<HostChip> chips = ProcessHostChips(options);
  TPUSHIM_ASSIGN_OR_RETURN(
      impl->chips,
      ChipOwnership::Acquire(*os, options.run_dir.value, chips,
                             options.premapped_region_enabled()
                                 ? options.premapped_buffer_size.value
                                 : kBouncePoolBytes));
  {
    std::vector<std::string> mapping;
    for (size_t i = 0; i < chips.size(); ++i) {
      mapping.push_back(absl::StrCat(i, "=", chips[i].name));
    }
    LOG(INFO) << "Chips owned by this process (device=host chip): "
              << absl::StrJoin(mapping, ", ") << "; lock files in "
              << options.run_dir.value;
  }
  std::vector<int> host_chips;
  if (!options.visible_chips.value.empty()) {
    host_chips = options.visible_chips.value;
  }
  TPUSHIM_ASSIGN_OR_RETURN(impl->devices, OpenDevices(options.device.value, os,
                                                      injector, host_chips));
  std::optional<int> device_node;
  for (const auto& d : impl->devices) {
    const DeviceInfo& info = d->info();
    impl->descriptions.push_back(
        DeviceDescription{.id = info.id,
                          .name = info.name,
                          .backend = info.backend,
                          .hbm_bytes = info.hbm_bytes,
                          .dma_engines = info.dma_engines,
                          .numa_node = info.numa_node,
                          .link_gbps = info.link_gbps,
                          .latency_us = info.latency_us,
                          .block_bytes = info.block_bytes,
                          .host_chip = info.host_chip});
    if (!device_node) device_node = info.numa_node;
  }
  std::vector<Device*> raw;
  for (auto& d : impl->devices) raw.push_back(d.get());
  // Before the region: a profile path that cannot be created fails now,
  // not after seconds of premapping.
  TransferEngine::Config engine_config =
      TransferEngine::Config::FromOptions(options);
  if (!options.memory_profile.value.empty()) {
    TPUSHIM_ASSIGN_OR_RETURN(
        engine_config.memory_profile,
        MemoryProfile::ForDevices(options.memory_profile.value, os, raw));
  }
  // The region is registered for every device's DMA while it is being
  // premapped (an IOMMU mapping for vfio:// devices, timed with it).
  std::vector<HostWindowId> region_windows;
  const PremappedRegion::DmaRegistration register_region =
      [&](void* base, uint64_t size) -> absl::Status {
    for (const auto& d : impl->devices) {
      const int64_t start = base_os->MonotonicNanos();
      absl::StatusOr<HostWindowId> w = d->RegisterHostWindow(base, size);
      if (!w.ok()) {
        for (size_t j = 0; j < region_windows.size(); ++j) {
          (void)impl->devices[j]->UnregisterHostWindow(region_windows[j]);
        }
        region_windows.clear();
        return absl::Status(
            w.status().code(),
            absl::StrCat("Registering the premapped region with ",
                         d->info().name, " failed: ", w.status().message()));
      }
      region_windows.push_back(*w);
      LOG(INFO) << "Registered premapped memory of size " << size
                << " for DMA by " << d->info().name << " in "
                << absl::StrFormat("%.3f",
                                   (base_os->MonotonicNanos() - start) / 1e9)
                << "s";
    }
    return absl::OkStatus();
  };
  const PremappedRegion::PrefaultProgress on_progress =
      [startup](uint64_t done_bytes, uint64_t total) {
        startup->Premapping(done_bytes, total);
      };
  if (options.premapped_region_enabled()) {
    startup->Premapping(0, options.premapped_buffer_size.value);
  }
  TPUSHIM_ASSIGN_OR_RETURN(
      impl->region, PremappedRegion::Create(options, os, injector, device_node,
                                            register_region, on_progress));
  {
    MutexLock lock(&impl->owner->mu);
    impl->owner->allocator =
        impl->region ? &impl->region->allocator() : nullptr;
  }
  // Premapped behind the caller: each device's window over the region is
  // reserved now and grows as the region is premapped, chunk by chunk.
  if (impl->region != nullptr && impl->region->background()) {
    void* const base = impl->region->base();
    const uint64_t size = impl->region->size();
    for (const auto& d : impl->devices) {
      absl::StatusOr<HostWindowId> w = d->ReserveHostWindow(base, size);
      if (!w.ok()) {
        for (size_t j = 0; j < region_windows.size(); ++j) {
          (void)impl->devices[j]->UnregisterHostWindow(region_windows[j]);
        }
        return absl::Status(
            w.status().code(),
            absl::StrCat("Registering the premapped region with ",
                         d->info().name, " failed: ", w.status().message()));
      }
      region_windows.push_back(*w);
    }
  }
  const std::vector<HostWindowId> windows = region_windows;
  TPUSHIM_ASSIGN_OR_RETURN(
      impl->engine, TransferEngine::Create(std::move(raw), impl->region.get(),
                                           os, std::move(engine_config),
                                           std::move(region_windows)));
  {
    WriterMutexLock lock(&impl->registrations->mu);
    impl->registrations->engine = impl->engine.get();
  }

  LOG(INFO) << "tpu::System initialized, current host id: 0, logical device "
               "ids: "
            << DeviceIdList(static_cast<int>(impl->devices.size()));
  impl->init_time = absl::Nanoseconds(base_os->MonotonicNanos() - start_ns);
  LOG(INFO) << "CreateTpuSystemState: TPU initialization is successful and "
               "it took "
            << absl::StrFormat("%.9f", absl::ToDoubleSeconds(impl->init_time))
            << "s";
  LOG(INFO) << "CreateTpuSystemState: using TPU host premapped buffer of "
               "size: "
            << options.premapped_buffer_size.value;
  // Premapping behind the caller starts once the creation lines are
  // written, so that its own lines (mlock()-ed, Done premapping) always
  // follow them in the log, as they follow libtpu's.
  if (impl->region != nullptr && impl->region->background()) {
    std::vector<Device*> devices;
    for (auto& d : impl->devices) devices.push_back(d.get());
    impl->region->StartPremapping(PremappedRegion::BackgroundHooks{
        .extend_dma = [devices, windows](uint64_t ready) -> absl::Status {
          for (size_t i = 0; i < devices.size(); ++i) {
            absl::Status s = devices[i]->ExtendHostWindow(windows[i], ready);
            if (!s.ok()) {
              return absl::Status(
                  s.code(), absl::StrCat("Registering the premapped region "
                                         "with ",
                                         devices[i]->info().name,
                                         " failed: ", s.message()));
            }
          }
          return absl::OkStatus();
        },
        .on_progress = on_progress,
        .on_done = [startup](const absl::Status&) { startup->Done(); }});
    premapping_behind = true;
  }
  System::Impl* const raw_impl = impl.get();
  auto system = std::unique_ptr<System>(new System(std::move(impl)));
  System* const sys = system.get();
  raw_impl->memories = std::make_unique<MemorySpaces>(
      sys, raw_impl->engine.get(), raw_impl->region.get(),
      raw_impl->descriptions,
      [sys](uint64_t size) { return sys->AllocatePinnedHost(size); });
  return system;
}

absl::StatusOr<std::unique_ptr<System>> System::Create(
    const OptionOverrides& overrides) {
  return SystemFactory::Create(overrides, Os::Default());
}

absl::StatusOr<std::unique_ptr<System>> System::Create(
    const OptionOverrides& overrides, StartupProgressCallback progress) {
  return SystemFactory::Create(overrides, Os::Default(), nullptr,
                               std::move(progress));
}

absl::StatusOr<std::unique_ptr<System>> System::Create(
    const OptionOverrides& overrides, StartupProgressCallback progress,
    StartupProgressUntil until) {
  return SystemFactory::Create(overrides, Os::Default(), nullptr,
                               std::move(progress), until);
}

void SystemFactory::StopPremapping(System& system) {
  // A fork() child's copy has no premapping thread to stop.
  if (ForkedChildOf(system.impl_->pid)) return;
  if (system.impl_->region != nullptr) system.impl_->region->StopPremapping();
}

System::System(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

System::~System() {
  if (impl_ != nullptr && ForkedChildOf(impl_->pid)) {
    // A fork() child's copy: its threads, pinned memory and devices stayed
    // with the parent, and its locks may be held forever. Tearing it down
    // would wait for threads that do not exist here; its heap goes with
    // the child's exec or exit.
    (void)impl_.release();
  }
}

int System::device_count() const {
  return static_cast<int>(impl_->devices.size());
}

const DeviceDescription& System::device(int device) const {
  if (device < 0 || device >= device_count()) {
    LOG(FATAL) << "System::device(" << device << "): devices are 0.."
               << device_count() - 1;
  }
  return impl_->descriptions[device];
}

absl::Duration System::init_time() const { return impl_->init_time; }

StartupProgress System::premap_progress() const {
  if (ForkedChildOf(impl_->pid)) return StartupProgress{};
  return impl_->startup->Snapshot();
}

absl::Status System::AwaitPremapped() {
  if (ForkedChildOf(impl_->pid)) return ForkedChildError("This System", impl_->pid);
  if (impl_->region == nullptr) return absl::OkStatus();
  return impl_->region->WaitUntilPremapped();
}

uint64_t System::premapped_bytes() const {
  return impl_->options.premapped_buffer_size.value;
}

uint64_t System::transfer_threshold_bytes() const {
  return impl_->region ? impl_->region->allocator().threshold() : 0;
}

std::string System::log_directory() const {
  return logging::ActiveLogDirectory();
}

absl::StatusOr<PinnedHostBuffer> System::AllocatePinnedHost(uint64_t size,
                                                            size_t alignment) {
  return AllocatePinnedHost(size, alignment, PremapWait::kWait);
}

absl::StatusOr<PinnedHostBuffer> System::AllocatePinnedHost(uint64_t size,
                                                            size_t alignment,
                                                            PremapWait wait) {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  if (impl_->region == nullptr) {
    return absl::FailedPreconditionError(
        "Cannot allocate a pinned host buffer: the premapped region is off "
        "(TPU_PREMAPPED_BUFFER_SIZE=0)");
  }
  TPUSHIM_ASSIGN_OR_RETURN(
      void* p,
      impl_->region->allocator().Allocate(
          size, alignment,
          wait == PremapWait::kNoWait ? RegionAllocator::IfNotReady::kFail
                                      : RegionAllocator::IfNotReady::kWait));
  if (impl_->memories != nullptr) impl_->memories->CountPinnedAllocation(size);
  return PinnedHostBuffer(impl_->owner, p, size);
}

absl::StatusOr<DeviceBuffer> System::AllocateDevice(int device, uint64_t size) {
  return impl_->engine->Allocate(device, size);
}

absl::StatusOr<DeviceBuffer> System::AllocateDevice(
    int device, const DeviceBufferSpec& spec) {
  return impl_->engine->Allocate(device, spec);
}

absl::StatusOr<Event> System::TransferArrayToDevice(
    const void* src, const DeviceBuffer& dst, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  return impl_->engine->TransferArrayToDevice(src, dst, wait_for, semantics);
}

absl::StatusOr<Event> System::TransferArrayFromDevice(
    const DeviceBuffer& src, void* dst, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  return impl_->engine->TransferArrayFromDevice(src, dst, wait_for, semantics);
}

absl::StatusOr<Event> System::Deallocate(const DeviceBuffer& buffer,
                                         absl::Span<const Event> wait_for) {
  return impl_->engine->Deallocate(buffer, wait_for);
}

absl::StatusOr<Event> System::TransferToDevice(const void* src,
                                               const DeviceBuffer& dst,
                                               uint64_t dst_offset,
                                               uint64_t size,
                                               absl::Span<const Event> wait_for,
                                               HostBufferSemantics semantics) {
  return impl_->engine->TransferToDevice(src, dst, dst_offset, size, wait_for,
                                         semantics);
}

absl::StatusOr<Event> System::TransferFromDevice(
    const DeviceBuffer& src, uint64_t src_offset, void* dst, uint64_t size,
    absl::Span<const Event> wait_for, HostBufferSemantics semantics) {
  return impl_->engine->TransferFromDevice(src, src_offset, dst, size, wait_for,
                                           semantics);
}

absl::StatusOr<Event> System::TransferDeviceToDevice(
    const DeviceBuffer& src, uint64_t src_offset, const DeviceBuffer& dst,
    uint64_t dst_offset, uint64_t size, absl::Span<const Event> wait_for) {
  return impl_->engine->TransferDeviceToDevice(src, src_offset, dst, dst_offset,
                                               size, wait_for);
}

absl::StatusOr<TransferEvents> System::TransferToDeviceWithEvents(
    const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
    uint64_t size, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  return impl_->engine->TransferToDeviceWithEvents(src, dst, dst_offset, size,
                                                   wait_for, semantics);
}

absl::StatusOr<TransferEvents> System::TransferArrayToDeviceWithEvents(
    const void* src, const DeviceBuffer& dst, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  return impl_->engine->TransferArrayToDeviceWithEvents(src, dst, wait_for,
                                                        semantics);
}

absl::StatusOr<CallerEvent> System::CreateEvent() {
  return impl_->engine->CreateEvent();
}

absl::StatusOr<Event> System::BufferReadyEvent(const DeviceBuffer& buffer) {
  return impl_->engine->BufferReadyEvent(buffer);
}

absl::Status System::BeginChunkedTransfer(const DeviceBuffer& dst) {
  return impl_->engine->BeginChunkedTransfer(dst);
}

absl::StatusOr<TransferEvents> System::TransferChunk(
    const void* src, const DeviceBuffer& dst, uint64_t dst_offset,
    uint64_t size, bool is_last, absl::Span<const Event> wait_for,
    HostBufferSemantics semantics) {
  return impl_->engine->TransferChunk(src, dst, dst_offset, size, is_last,
                                      wait_for, semantics);
}

absl::Status System::AbortChunkedTransfer(const DeviceBuffer& dst,
                                          absl::Status error) {
  return impl_->engine->AbortChunkedTransfer(dst, std::move(error));
}

TransferPath System::PathFor(const void* host, uint64_t size) const {
  return impl_->engine->PathFor(host, size);
}

absl::StatusOr<HostRegistration> System::RegisterHostMemory(const void* data,
                                                            uint64_t size) {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  TPUSHIM_ASSIGN_OR_RETURN(const uint64_t id,
                           impl_->engine->RegisterHostMemory(data, size));
  return HostRegistration(impl_->registrations, id, data, size);
}

SystemStats System::GetStats() const {
  SystemStats s;
  if (ForkedChildOf(impl_->pid)) return s;
  s.transfers = impl_->engine->GetStats();
  if (impl_->region != nullptr) {
    const PremappedRegion::Stats r = impl_->region->GetStats();
    s.region.enabled = true;
    s.region.capacity_bytes = r.allocator.capacity_bytes;
    s.region.threshold_bytes = r.allocator.threshold_bytes;
    s.region.bytes_in_use = r.allocator.bytes_in_use;
    s.region.peak_bytes_in_use = r.allocator.peak_bytes_in_use;
    s.region.free_bytes = r.allocator.free_bytes;
    s.region.largest_free_block = r.allocator.largest_free_block;
    s.region.fragmentation = r.allocator.fragmentation;
    s.region.allocations = r.allocator.allocations;
    s.region.frees = r.allocator.frees;
    s.region.failures = r.allocator.failures;
    s.region.live_allocations = r.allocator.live_allocations;
    s.region.page_kind = std::string(PageKindName(r.page_kind));
    s.region.page_bytes = r.page_bytes;
    s.region.huge_page_bytes = r.huge_page_bytes;
    s.region.page_kind_asked = std::string(PageKindName(r.page_kind_asked));
    s.region.page_description = r.page_description;
    s.region.numa_node = r.numa_node;
    s.region.numa_policy = r.numa_policy;
    s.region.prefault_threads = r.prefault_threads;
    s.region.locked_bytes = r.locked_bytes;
    s.region.locked = r.locked;
    s.region.lock_error =
        r.lock_error.ok() ? std::string() : r.lock_error.ToString();
    s.region.startup_time = r.startup_time;
    s.region.background = r.background;
    s.region.ready_bytes = r.ready_bytes;
    s.region.premapped = r.premapped;
    s.region.premap_error =
        r.premap_error.ok() ? std::string() : r.premap_error.ToString();
    s.region.ready_waits = r.allocator.ready_waits;
    s.region.ready_wait_time = absl::Nanoseconds(r.allocator.ready_wait_ns);
  }
  const std::vector<DeviceMemoryUse> use = impl_->engine->GetMemoryUse();
  for (size_t i = 0; i < impl_->devices.size(); ++i) {
    const Device& d = *impl_->devices[i];
    const DeviceMemoryStats m = d.GetMemoryStats();
    const DeviceMemoryUse u = i < use.size() ? use[i] : DeviceMemoryUse{};
    s.devices.push_back(
        DeviceStats{.id = d.info().id,
                    .name = d.info().name,
                    .hbm_bytes = d.info().hbm_bytes,
                    .hbm_in_use = m.bytes_in_use,
                    .buffers_live = u.buffers,
                    .padded_bytes_in_use = u.padded_bytes,
                    .unpadded_bytes_in_use = u.unpadded_bytes,
                    .peak_padded_bytes = u.peak_padded_bytes,
                    .peak_unpadded_bytes = u.peak_unpadded_bytes,
                    .hbm_free = m.free_bytes,
                    .largest_free_block = m.largest_free_block,
                    .fragmentation = m.fragmentation,
                    .num_allocs = u.num_allocs,
                    .largest_alloc_size = u.largest_alloc_size});
  }
  return s;
}

// ---- Memory kinds (driver/memory_spaces.h does the work) -------------------

std::vector<MemoryDescription> System::memories() const {
  return impl_->memories->List();
}

int System::memory_of_kind(MemoryKind kind, int device) const {
  switch (kind) {
    case MemoryKind::kDevice:
      (void)this->device(device);  // checks it
      return device;
    case MemoryKind::kPinnedHost:
      return impl_->memories->pinned_host_id();
    case MemoryKind::kUnpinnedHost:
      return impl_->memories->unpinned_host_id();
  }
  return -1;
}

absl::StatusOr<int> System::DefaultMemory(int device) const {
  if (device < 0 || device >= device_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DefaultMemory: device ", device,
                     " does not exist (devices 0..", device_count() - 1, ")"));
  }
  return device;
}

absl::StatusOr<MemoryBuffer> System::AllocateInMemory(int memory,
                                                      uint64_t size) {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  return impl_->memories->Allocate(memory, size);
}

absl::StatusOr<MemoryBuffer> System::AllocateInMemory(
    int memory, const DeviceBufferSpec& spec) {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  return impl_->memories->Allocate(memory, spec);
}

absl::StatusOr<MemoryCopy> System::CreateMemoryBuffer(
    const void* data, uint64_t size, int memory,
    HostBufferSemantics semantics) {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  return impl_->memories->Create(data, size, memory, semantics);
}

absl::StatusOr<MemoryCopy> System::CreateMemoryBuffer(
    const void* data, int memory, const DeviceBufferSpec& spec,
    HostBufferSemantics semantics) {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  return impl_->memories->Create(data, memory, spec, semantics);
}

absl::StatusOr<Event> System::BufferReadyEvent(const MemoryBuffer& buffer) {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  return impl_->memories->ReadyEvent(buffer);
}

absl::StatusOr<MemoryCopy> System::CopyToMemory(
    const MemoryBuffer& src, int memory, absl::Span<const Event> wait_for) {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  return impl_->memories->CopyToMemory(src, memory, wait_for);
}

MemoryBuffer System::AsMemoryBuffer(const DeviceBuffer& buffer) const {
  return impl_->memories->Wrap(buffer);
}

absl::StatusOr<Event> System::Free(const MemoryBuffer& buffer,
                                   absl::Span<const Event> wait_for) {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  return impl_->memories->Free(buffer, wait_for);
}

absl::StatusOr<MemoryStats> System::GetMemoryStats(int memory) const {
  if (ForkedChildOf(impl_->pid)) {
    return ForkedChildError("This System", impl_->pid);
  }
  TPUSHIM_RETURN_IF_ERROR(
      impl_->memories->CheckMemory("GetMemoryStats", memory));
  if (memory >= device_count()) return impl_->memories->HostStats(memory);
  const Device& d = *impl_->devices[memory];
  const DeviceMemoryStats m = d.GetMemoryStats();
  const std::vector<DeviceMemoryUse> use = impl_->engine->GetMemoryUse();
  const DeviceMemoryUse u = static_cast<size_t>(memory) < use.size()
                                ? use[memory]
                                : DeviceMemoryUse{};
  return MemoryStats{.memory = memory,
                     .kind = MemoryKind::kDevice,
                     .bytes_in_use = u.padded_bytes,
                     .peak_bytes_in_use = u.peak_padded_bytes,
                     .num_allocs = u.num_allocs,
                     .largest_alloc_size = u.largest_alloc_size,
                     .has_bytes_limit = true,
                     .bytes_limit = d.info().hbm_bytes,
                     .largest_free_block_bytes = m.largest_free_block,
                     .buffers_live = u.buffers};
}

}  // namespace tpushim
