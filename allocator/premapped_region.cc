#include "allocator/premapped_region.h"

#include <algorithm>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/prefaulter.h"
#include "common/human_bytes.h"
#include "common/status_macros.h"
#include "env/chips.h"
#include "env/fork_guard.h"
#include "env/host_facts.h"
#include "env/mapping_facts.h"
#include "logging/log.h"

namespace tpushim {
namespace {

// Whether an mlock call that succeeded took: the mapping carries the lock
// flag (a sanitizer runtime's mlock returns success and does nothing).
// OK when it did, or when the flags cannot be read (the call's word is
// all there is).
absl::Status LockTook(Os& os, const MappedRange& range) {
  absl::StatusOr<MappingFacts> facts =
      ReadMappingFacts(os, range.start, range.length);
  if (!facts.ok() || facts->lock_flag) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "mlock() of the premapped region succeeded, but the kernel does not "
      "hold the mapping locked");
}

}  // namespace

absl::StatusOr<std::unique_ptr<PremappedRegion>> PremappedRegion::Create(
    const Options& options, Os* os, FaultInjector* faults,
    std::optional<int> device_numa_node,
    const DmaRegistration& register_for_dma,
    const PrefaultProgress& on_progress) {
  const uint64_t size = options.premapped_buffer_size.value;
  const uint64_t threshold =
      options.premapped_buffer_transfer_threshold_bytes.value;
  if (size == 0) {
    LOG(INFO) << "TPU premapped buffer disabled.";
    LOG(INFO) << "Creating numa aware allocators, number of NUMA nodes "
              << os->NumaNodeCount();
    return std::unique_ptr<PremappedRegion>();
  }
  const int64_t start_ns = os->MonotonicNanos();
  LOG(INFO) << "TPU premapped buffer enabled. Size: " << size
            << " Threshold: " << threshold;
  const int nodes = os->NumaNodeCount();
  LOG(INFO) << "Creating numa aware allocators, number of NUMA nodes " << nodes;

  // 1. Checks before touching memory.
  TPUSHIM_ASSIGN_OR_RETURN(HostFacts facts, ReadHostFacts(*os));
  AddOtherTpushimProcesses(*os, options.run_dir.value, facts);
  const MlockMode mlock_mode = options.mlock.value;
  bool try_mlock = mlock_mode != MlockMode::kOff;
  absl::Status lock_error;  // why the region will not be locked
  for (const HostClash& clash : CheckOptionsAgainstHost(options, facts)) {
    if (clash.level == HostClash::Level::kError) return clash.ToStatus();
    LOG(WARNING) << clash.message;
    // The one warning: the memlock limit is too small to pin the region.
    if (clash.check == HostClash::Check::kMemlock) {
      try_mlock = false;
      lock_error = clash.ToStatus();
    }
  }
  const std::optional<int>& explicit_node = options.numa_node.value;
  int node = explicit_node
                 ? *explicit_node
                 : device_numa_node.value_or(os->NumaNodeOfCurrentCpu());
  // With several nodes, binding to one that cannot hold the region would
  // end in the OOM killer.
  bool bind = true;
  for (const HostFacts::NumaNode& n : facts.numa_nodes) {
    if (nodes < 2 || n.node != node || n.free_bytes >= size) continue;
    const std::string why = absl::StrCat(
        "NUMA node ", node, " has ", BytesWithHumanReadable(n.free_bytes),
        " free, less than the ", BytesWithHumanReadable(size),
        " premapped region");
    if (explicit_node) {
      return absl::ResourceExhaustedError(absl::StrCat(
          why, "; set TPUSHIM_NUMA_NODE to another node or to auto"));
    }
    LOG(WARNING) << why << "; not binding the region to a node";
    bind = false;
  }
  const PagePlan plan = ChoosePages(options.hugepages.value, facts, size);

  LOG(INFO) << "Starting premapped memory manager initialization...";
  LOG(INFO) << "Premapped buffer is using alignment "
            << RegionAllocator::kAlignment;

  // 2. Map.
  TPUSHIM_ASSIGN_OR_RETURN(MappedRange range,
                           MapRegion(*os, size, plan, options.hugepages.value));
  absl::Cleanup unmap = [&] {
    ForgetForkExclusion(range.start);
    (void)os->Munmap(range.start, range.length);
  };
  // A fork() child must not share it: the parent's writes to it would turn
  // copy-on-write for as long as the child lives. Tolerated, as the
  // huge-page advice is: the region works, forks are only slower.
  if (absl::Status excluded = ExcludeFromFork(*os, range.start, range.length,
                                              "the premapped region");
      !excluded.ok()) {
    LOG(WARNING) << excluded
                 << "; a fork() child will share the region copy-on-write";
  }

  // 3. Bind before the first touch.
  absl::Status bound = bind
                           ? os->NumaBindMemory(range.start, range.length, node)
                           : absl::OkStatus();
  if (!bound.ok()) {
    if (explicit_node) return bound;
    LOG(WARNING) << "Cannot bind the premapped region to NUMA node " << node
                 << ": " << bound
                 << "; its pages go where the kernel puts them";
  }

  // 4. Pin: lock on fault, so the pre-fault threads lock each page as they
  // populate it; a separate mlock() pass after pre-faulting would walk the
  // whole region again on one thread (0.4 s for 4 GiB of THP here).
  Prepared prepared{.range = range,
                    .size = size,
                    .node = node,
                    .lock_error = lock_error,
                    .start_ns = start_ns};
  if (try_mlock) {
    absl::Status pinned =
        os->Mlock(range.start, range.length, Os::LockWhen::kOnFault);
    ++prepared.mlock_syscalls;
    if (pinned.ok()) {
      prepared.locked = true;
    } else if (mlock_mode == MlockMode::kRequired) {
      return pinned;
    } else {
      LOG(WARNING) << "mlock() of the premapped region failed: " << pinned
                   << "; continuing unpinned (TPUSHIM_MLOCK=required makes "
                      "this an error, =off skips it)";
      prepared.lock_error =
          absl::Status(pinned.code(),
                       absl::StrCat("mlock() of the premapped region failed: ",
                                    pinned.message()));
    }
  }
  {
    const Prefaulter sizing(*os, static_cast<char*>(range.start), range.length,
                            range.plan.page_bytes, node);
    prepared.threads = sizing.ThreadsFor(
        options.EffectivePrefaultThreads(os->OnlineCpuCount()));
  }
  const bool background = options.premap.value == PremapMode::kBackground;
  auto allocator = std::make_unique<RegionAllocator>(
      range.start, size,
      RegionAllocator::Config{.threshold = threshold,
                              .dump_on_oom = options.dump_on_oom.value,
                              .faults = faults,
                              .grows = background});
  // From here the region owns the mapping and the lock.
  std::move(unmap).Cancel();
  auto region = std::unique_ptr<PremappedRegion>(
      new PremappedRegion(os, prepared, std::move(allocator)));
  if (background) {
    region->background_ = std::make_unique<Background>();
    // Locked on fault is locked: every page the premapping threads
    // populate is locked as it comes, so the region is locked from now on
    // if the lock took.
    if (prepared.locked) {
      const absl::Status took = LockTook(*os, range);
      MutexLock lock(&region->mu_);
      region->stats_.locked = took.ok();
      region->stats_.lock_error = took;
    }
    return region;
  }

  // 5. Pre-fault, then 6. register with the devices.
  std::function<absl::Status(uint64_t)> on_ready = nullptr;
  if (on_progress) {
    on_ready = [&on_progress, total = size](uint64_t ready) {
      on_progress(ready, total);
      return absl::OkStatus();
    };
  }
  TPUSHIM_RETURN_IF_ERROR(region->Populate(on_ready, register_for_dma));
  return region;
}

// What runs behind the caller.
struct PremappedRegion::Background {
  Mutex mu;
  BackgroundHooks hooks;
  // Serializes StopPremapping's join of `thread`.
  Mutex join_mu;
  std::thread thread ABSL_GUARDED_BY(join_mu);
  // The running prefaulter, for StopPremapping; null before and after.
  Prefaulter* prefaulter ABSL_GUARDED_BY(mu) = nullptr;
  bool started ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  CondVar done_cv;
};

PremappedRegion::PremappedRegion(Os* os, const Prepared& prepared,
                                 std::unique_ptr<RegionAllocator> allocator)
    : os_(os), prepared_(prepared), allocator_(std::move(allocator)) {
  MutexLock lock(&mu_);
  stats_.page_kind = prepared.range.plan.kind;
  stats_.page_bytes = prepared.range.plan.page_bytes;
  stats_.page_kind_asked = prepared.range.plan.kind;
  stats_.page_description = "being premapped";
  stats_.numa_node = prepared.node;
  stats_.numa_policy = "unknown";
  stats_.prefault_threads = prepared.threads;
  stats_.lock_requested = prepared.locked;
  stats_.lock_error = prepared.lock_error;
}

absl::Status PremappedRegion::Populate(
    const std::function<absl::Status(uint64_t ready)>& on_ready,
    const DmaRegistration& register_for_dma) {
  const MappedRange& range = prepared_.range;
  const uint64_t size = prepared_.size;
  Prefaulter* running = nullptr;
  absl::Status hook_error;
  Prefaulter::ReadyCallback ready_callback = nullptr;
  if (on_ready) {
    ready_callback = [&](uint64_t ready) {
      if (!hook_error.ok()) return;
      hook_error = on_ready(std::min(ready, size));
      if (!hook_error.ok()) running->Cancel();
    };
  }
  Prefaulter prefaulter(*os_, static_cast<char*>(range.start), range.length,
                        range.plan.page_bytes, prepared_.node,
                        std::move(ready_callback));
  running = &prefaulter;
  if (background_ != nullptr) {
    MutexLock lock(&background_->mu);
    if (background_->stop) {
      return absl::CancelledError("premapping was stopped before it started");
    }
    background_->prefaulter = &prefaulter;
  }
  absl::Status populated = prefaulter.Run(prepared_.threads);
  if (background_ != nullptr) {
    MutexLock lock(&background_->mu);
    background_->prefaulter = nullptr;
  }
  if (!hook_error.ok()) return hook_error;
  TPUSHIM_RETURN_IF_ERROR(populated);
  // What the kernel did: the page size and huge pages backing the region,
  // the bytes it holds locked, the NUMA policy and where the pages are.
  const ObservedPages seen = ObservePages(*os_, range, prepared_.locked);
  if (seen.locked_bytes > 0) {
    LOG(INFO) << "mlock()-ed " << seen.locked_bytes
              << " bytes for premapped region, using "
              << prepared_.mlock_syscalls << " syscalls.";
  }
  if (prepared_.locked && seen.locked_bytes < range.length) {
    LOG(WARNING) << "mlock() of the premapped region succeeded, but the "
                    "kernel holds only "
                 << seen.locked_bytes << " of its " << range.length
                 << " bytes locked (a sanitizer runtime's mlock does "
                    "nothing); the rest may be swapped out";
  }
  // 6. Register with the devices (nothing can fail after this step).
  if (register_for_dma) {
    TPUSHIM_RETURN_IF_ERROR(register_for_dma(range.start, size));
  }

  const absl::Duration elapsed =
      absl::Nanoseconds(os_->MonotonicNanos() - prepared_.start_ns);
  // The node the pages are on; the one asked for when that cannot be
  // read, and all of them when they are spread.
  const int node = prepared_.node;
  std::string where = absl::StrCat(node);
  if (seen.numa_nodes.size() == 1) {
    where = absl::StrCat(seen.numa_nodes[0]);
  } else if (seen.numa_nodes.size() > 1) {
    where = absl::StrCat(node, " (pages found on nodes ",
                         absl::StrJoin(seen.numa_nodes, ","), ")");
  }
  LOG(INFO) << "Done premapping memory of size " << size << " in "
            << absl::StrFormat("%.3f", absl::ToDoubleSeconds(elapsed)) << "s ("
            << seen.description << ", " << prepared_.threads
            << " threads, NUMA node " << where << ")";
  {
    MutexLock lock(&mu_);
    stats_.page_kind = seen.kind;
    stats_.page_bytes = seen.page_bytes;
    stats_.huge_page_bytes = seen.huge_bytes;
    stats_.page_description = seen.description;
    stats_.numa_node = seen.numa_nodes.size() == 1 ? seen.numa_nodes[0] : node;
    stats_.numa_policy = seen.numa_policy;
    stats_.numa_nodes = seen.numa_nodes;
    stats_.locked_bytes = seen.locked_bytes;
    stats_.locked = seen.locked_bytes >= range.length;
    if (prepared_.locked && !stats_.locked) {
      stats_.lock_error = absl::FailedPreconditionError(absl::StrCat(
          "mlock() of the premapped region succeeded, but the kernel holds "
          "only ",
          seen.locked_bytes, " of its ", range.length, " bytes locked"));
    } else if (stats_.locked) {
      stats_.lock_error = absl::OkStatus();
    }
    stats_.startup_time = elapsed;
    stats_.premapped = true;
  }
  LOG(INFO) << "Done allocating premapped memory of size " << size;
  return absl::OkStatus();
}

void PremappedRegion::StartPremapping(BackgroundHooks hooks) {
  Background& b = *background_;
  std::string cannot_start;
  {
    MutexLock join_lock(&b.join_mu);
    MutexLock lock(&b.mu);
    b.started = true;
    b.hooks = std::move(hooks);
    try {
      b.thread = std::thread([this] { RunBackground(); });
    } catch (const std::system_error& e) {
      cannot_start = e.what();
    }
  }
  // No thread: premapping ends here, as a failure behind the caller would.
  if (!cannot_start.empty()) {
    FinishBackground(absl::ResourceExhaustedError(
        absl::StrCat("cannot start the premapping thread: ", cannot_start)));
  }
}

void PremappedRegion::RunBackground() {
  Background& b = *background_;
  // The size asked for, not the mapping's (rounded up to its page size):
  // progress ends at what the caller knows as the region's size.
  const uint64_t total = prepared_.size;
  absl::Status status = Populate(
      [&](uint64_t ready) -> absl::Status {
        if (b.hooks.extend_dma) {
          TPUSHIM_RETURN_IF_ERROR(b.hooks.extend_dma(ready));
        }
        allocator_->Grow(ready);
        if (b.hooks.on_progress) b.hooks.on_progress(ready, total);
        return absl::OkStatus();
      },
      nullptr);
  FinishBackground(status);
}

void PremappedRegion::FinishBackground(const absl::Status& status) {
  Background& b = *background_;
  const uint64_t size = prepared_.size;
  const uint64_t ready = allocator_->ready_bytes();
  if (status.ok()) {
    allocator_->Grow(size);
  } else {
    allocator_->StopGrowing(status);
    if (status.code() == absl::StatusCode::kCancelled) {
      LOG(INFO) << "Premapping stopped after " << ready << " of " << size
                << " bytes: the system is being destroyed";
    } else {
      LOG(ERROR) << "Premapping the region failed after " << ready << " of "
                 << size << " bytes: " << status
                 << "; buffers and staging use the first " << ready
                 << " bytes, transfers that need more take the pinned path";
    }
    MutexLock lock(&mu_);
    stats_.premap_error = status;
  }
  if (b.hooks.on_done) b.hooks.on_done(status);
  MutexLock lock(&b.mu);
  b.done = true;
  b.status = status;
  b.done_cv.SignalAll();
}

void PremappedRegion::StopPremapping() {
  if (background_ == nullptr) return;
  Background& b = *background_;
  // Waiting allocations first: they return now, not after the chunks in
  // progress.
  allocator_->StopGrowing(
      absl::CancelledError("premapping was stopped before it finished"));
  {
    MutexLock lock(&b.mu);
    b.stop = true;
    if (b.prefaulter != nullptr) b.prefaulter->Cancel();
  }
  MutexLock join_lock(&b.join_mu);
  if (b.thread.joinable()) b.thread.join();
}

absl::Status PremappedRegion::WaitUntilPremapped() {
  if (background_ == nullptr) return absl::OkStatus();
  Background& b = *background_;
  MutexLock lock(&b.mu);
  while (!b.done) {
    if (!b.started) {
      return b.stop ? absl::CancelledError(
                          "premapping was stopped before it started")
                    : absl::FailedPreconditionError(
                          "premapping was never started");
    }
    b.done_cv.Wait(&b.mu);
  }
  return b.status;
}

PremappedRegion::~PremappedRegion() {
  StopPremapping();
  const uint64_t live = allocator_->GetStats().live_allocations;
  if (live > 0) {
    LOG(WARNING) << "Releasing the premapped region with " << live
                 << " buffers still allocated";
  }
  allocator_.reset();
  const MappedRange& range = prepared_.range;
  if (prepared_.locked) {
    absl::Status s = os_->Munlock(range.start, range.length);
    if (!s.ok()) LOG(WARNING) << "munlock of the premapped region: " << s;
  }
  ForgetForkExclusion(range.start);
  absl::Status s = os_->Munmap(range.start, range.length);
  if (!s.ok()) LOG(WARNING) << "munmap of the premapped region: " << s;
}

PremappedRegion::Stats PremappedRegion::GetStats() const {
  Stats stats;
  {
    MutexLock lock(&mu_);
    stats = stats_;
  }
  stats.allocator = allocator_->GetStats();
  stats.background = background_ != nullptr;
  stats.ready_bytes = stats.allocator.ready_bytes;
  // Until it is read back: what is premapped of a region locked on fault.
  if (!stats.premapped && stats.locked) stats.locked_bytes = stats.ready_bytes;
  return stats;
}

}  // namespace tpushim
