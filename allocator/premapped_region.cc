#include "allocator/premapped_region.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/prefaulter.h"
#include "common/human_bytes.h"
#include "common/status_macros.h"
#include "env/host_facts.h"
#include "logging/log.h"

namespace tpushim {

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
  const MlockMode mlock_mode = options.mlock.value;
  bool try_mlock = mlock_mode != MlockMode::kOff;
  for (const HostClash& clash : CheckOptionsAgainstHost(options, facts)) {
    if (clash.level == HostClash::Level::kError) return clash.ToStatus();
    LOG(WARNING) << clash.message;
    // The one warning: the memlock limit is too small to pin the region.
    if (clash.check == HostClash::Check::kMemlock) try_mlock = false;
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
  absl::Cleanup unmap = [&] { (void)os->Munmap(range.start, range.length); };

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
  bool locked = false;
  int mlock_syscalls = 0;  // each Os::Mlock is one mlock2() (or mlock())
  if (try_mlock) {
    absl::Status pinned =
        os->Mlock(range.start, range.length, Os::LockWhen::kOnFault);
    ++mlock_syscalls;
    if (pinned.ok()) {
      locked = true;
    } else if (mlock_mode == MlockMode::kRequired) {
      return pinned;
    } else {
      LOG(WARNING) << "mlock() of the premapped region failed: " << pinned
                   << "; continuing unpinned (TPUSHIM_MLOCK=required makes "
                      "this an error, =off skips it)";
    }
  }
  absl::Cleanup unlock = [&] {
    if (locked) (void)os->Munlock(range.start, range.length);
  };

  // 5. Pre-fault.
  Prefaulter::ReadyCallback on_ready = nullptr;
  if (on_progress) {
    on_ready = [&on_progress, total = range.length](uint64_t ready) {
      on_progress(ready, total);
    };
  }
  Prefaulter prefaulter(*os, static_cast<char*>(range.start), range.length,
                        range.plan.page_bytes, node, std::move(on_ready));
  const int threads = prefaulter.ThreadsFor(
      options.EffectivePrefaultThreads(os->OnlineCpuCount()));
  TPUSHIM_RETURN_IF_ERROR(prefaulter.Run(threads));
  // What the kernel did: the page size and huge pages backing the region,
  // the bytes it holds locked, the NUMA policy and where the pages are.
  const ObservedPages seen = ObservePages(*os, range, locked);
  if (seen.locked_bytes > 0) {
    LOG(INFO) << "mlock()-ed " << seen.locked_bytes
              << " bytes for premapped region, using " << mlock_syscalls
              << " syscalls.";
  }
  if (locked && seen.locked_bytes < range.length) {
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
      absl::Nanoseconds(os->MonotonicNanos() - start_ns);
  // The node the pages are on; the one asked for when that cannot be
  // read, and all of them when they are spread.
  std::string where = absl::StrCat(node);
  if (seen.numa_nodes.size() == 1) {
    where = absl::StrCat(seen.numa_nodes[0]);
  } else if (seen.numa_nodes.size() > 1) {
    where = absl::StrCat(node, " (pages found on nodes ",
                         absl::StrJoin(seen.numa_nodes, ","), ")");
  }
  LOG(INFO) << "Done premapping memory of size " << size << " in "
            << absl::StrFormat("%.3f", absl::ToDoubleSeconds(elapsed)) << "s ("
            << seen.description << ", " << threads << " threads, NUMA node "
            << where << ")";

  auto allocator = std::make_unique<RegionAllocator>(
      range.start, size,
      RegionAllocator::Config{.threshold = threshold,
                              .dump_on_oom = options.dump_on_oom.value,
                              .faults = faults});
  Stats stats;
  stats.page_kind = seen.kind;
  stats.page_bytes = seen.page_bytes;
  stats.huge_page_bytes = seen.huge_bytes;
  stats.page_kind_asked = range.plan.kind;
  stats.page_description = seen.description;
  stats.numa_node = seen.numa_nodes.size() == 1 ? seen.numa_nodes[0] : node;
  stats.numa_policy = seen.numa_policy;
  stats.numa_nodes = seen.numa_nodes;
  stats.prefault_threads = threads;
  stats.lock_requested = locked;
  stats.locked_bytes = seen.locked_bytes;
  stats.locked = seen.locked_bytes >= range.length;
  stats.startup_time = elapsed;
  std::move(unlock).Cancel();
  std::move(unmap).Cancel();
  LOG(INFO) << "Done allocating premapped memory of size " << size;
  return std::unique_ptr<PremappedRegion>(new PremappedRegion(
      os, range.start, range.length, std::move(allocator), stats));
}

PremappedRegion::PremappedRegion(Os* os, void* mapping, uint64_t mapping_bytes,
                                 std::unique_ptr<RegionAllocator> allocator,
                                 Stats stats)
    : os_(os),
      mapping_(mapping),
      mapping_bytes_(mapping_bytes),
      allocator_(std::move(allocator)),
      startup_stats_(stats) {}

PremappedRegion::~PremappedRegion() {
  const uint64_t live = allocator_->GetStats().live_allocations;
  if (live > 0) {
    LOG(WARNING) << "Releasing the premapped region with " << live
                 << " buffers still allocated";
  }
  allocator_.reset();
  if (startup_stats_.lock_requested) {
    absl::Status s = os_->Munlock(mapping_, mapping_bytes_);
    if (!s.ok()) LOG(WARNING) << "munlock of the premapped region: " << s;
  }
  absl::Status s = os_->Munmap(mapping_, mapping_bytes_);
  if (!s.ok()) LOG(WARNING) << "munmap of the premapped region: " << s;
}

PremappedRegion::Stats PremappedRegion::GetStats() const {
  Stats stats = startup_stats_;
  stats.allocator = allocator_->GetStats();
  return stats;
}

}  // namespace tpushim
