#include "allocator/premapped_region.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/human_bytes.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "env/host_facts.h"
#include "logging/log.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace tpushim {
namespace {

constexpr uint64_t kSmallPage = 4096;
constexpr uint64_t kHugePage = uint64_t{2} << 20;
// Pre-fault work is handed out in chunks of this size, so threads finish
// together and progress can be reported.
constexpr uint64_t kPrefaultChunk = uint64_t{64} << 20;
uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// How the region will be backed.
struct PagePlan {
  PageKind kind = PageKind::k4K;
  uint64_t page_bytes = kSmallPage;
};

// The backing TPUSHIM_HUGEPAGES asks for. The host checks have already
// refused an explicit mode the host cannot serve.
PagePlan ChoosePages(HugePagesMode mode, const HostFacts& facts,
                     uint64_t size) {
  const std::optional<HostFacts::HugePagePool> pool = facts.PoolFor(size);
  const bool thp =
      facts.thp_enabled == "always" || facts.thp_enabled == "madvise";
  switch (mode) {
    case HugePagesMode::kOff:
      return PagePlan{};
    case HugePagesMode::kHugetlb:
      return PagePlan{PageKind::kHugetlb, pool ? pool->page_bytes : kHugePage};
    case HugePagesMode::kThp:
      return PagePlan{PageKind::kThp, kHugePage};
    case HugePagesMode::kAuto:
      if (pool) return PagePlan{PageKind::kHugetlb, pool->page_bytes};
      if (thp) return PagePlan{PageKind::kThp, kHugePage};
      return PagePlan{};
  }
  return PagePlan{};
}

// Maps `bytes` per `plan`; returns the aligned start and the mapped length,
// which `bytes` rounded up to the page size. On THP, trims the slack used
// for alignment. Falls back from hugetlb/THP to 4 KiB pages under `auto`.
struct MappedRange {
  void* start = nullptr;
  uint64_t length = 0;
  PagePlan plan;
};

absl::StatusOr<MappedRange> MapRegion(Os& os, uint64_t bytes, PagePlan plan,
                                      HugePagesMode mode) {
  const int prot = PROT_READ | PROT_WRITE;
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (plan.kind == PageKind::kHugetlb) {
    const uint64_t length = RoundUp(bytes, plan.page_bytes);
    const int shift = std::countr_zero(plan.page_bytes);
    absl::StatusOr<void*> p =
        os.Mmap(nullptr, length, prot,
                flags | MAP_HUGETLB | (shift << MAP_HUGE_SHIFT), -1, 0);
    if (p.ok()) return MappedRange{*p, length, plan};
    if (mode != HugePagesMode::kAuto) return p.status();
    LOG(INFO) << "hugetlb mapping failed (" << p.status()
              << "); using transparent huge pages or 4 KiB pages instead";
    plan = PagePlan{PageKind::kThp, kHugePage};
  }
  if (plan.kind == PageKind::kThp) {
    // Over-map by one huge page, then trim to a 2 MiB-aligned range.
    const uint64_t length = RoundUp(bytes, kHugePage);
    TPUSHIM_ASSIGN_OR_RETURN(
        void* raw, os.Mmap(nullptr, length + kHugePage, prot, flags, -1, 0));
    const uintptr_t raw_addr = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = RoundUp(raw_addr, kHugePage);
    const uint64_t head = aligned - raw_addr;
    const uint64_t tail = kHugePage - head;
    absl::Status trim = absl::OkStatus();
    if (head > 0) trim = os.Munmap(raw, head);
    if (trim.ok() && tail > 0) {
      trim = os.Munmap(reinterpret_cast<void*>(aligned + length), tail);
    }
    if (!trim.ok()) {
      (void)os.Munmap(raw, length + kHugePage);
      return trim;
    }
    void* start = reinterpret_cast<void*>(aligned);
    absl::Status advised = os.Madvise(start, length, MADV_HUGEPAGE);
    if (advised.ok()) return MappedRange{start, length, plan};
    if (mode != HugePagesMode::kAuto) {
      (void)os.Munmap(start, length);
      return advised;
    }
    LOG(INFO) << "madvise(MADV_HUGEPAGE) failed (" << advised
              << "); using 4 KiB pages";
    return MappedRange{start, length, PagePlan{}};
  }
  const uint64_t length = RoundUp(bytes, kSmallPage);
  TPUSHIM_ASSIGN_OR_RETURN(void* p,
                           os.Mmap(nullptr, length, prot, flags, -1, 0));
  return MappedRange{p, length, plan};
}

// Pre-faults [base, base + length) from `threads` threads bound to `node`,
// logging progress about once a second. Returns the first error.
class Prefaulter {
 public:
  Prefaulter(Os& os, char* base, uint64_t length, uint64_t granule, int node)
      : os_(os),
        base_(base),
        length_(length),
        chunk_(std::max(
            granule, std::min(kPrefaultChunk, RoundUp(length / 8, granule)))),
        node_(node) {}

  // Number of threads worth starting for `requested`.
  int ThreadsFor(int requested) const {
    const uint64_t chunks = (length_ + chunk_ - 1) / chunk_;
    return static_cast<int>(
        std::max<uint64_t>(1, std::min<uint64_t>(requested, chunks)));
  }

  absl::Status Run(int threads) {
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (int i = 0; i < threads; ++i) {
      try {
        workers.emplace_back([this] { Work(); });
      } catch (const std::system_error& e) {
        Fail(absl::ResourceExhaustedError(
            absl::StrCat("cannot start a pre-fault thread: ", e.what())));
        break;
      }
    }
    {
      MutexLock lock(&mu_);
      spawned_ = static_cast<int>(workers.size());
    }
    for (;;) {
      if (WaitForWorkers(absl::Seconds(1))) break;
      const uint64_t done = done_bytes_.load(std::memory_order_relaxed);
      LOG(INFO) << "Premapping memory: " << done << " of " << length_
                << " bytes (" << done * 100 / length_ << "%)";
    }
    for (std::thread& t : workers) t.join();
    MutexLock lock(&mu_);
    return first_error_;
  }

 private:
  void Work() {
    // Thread placement only affects speed: a failure is worth one warning.
    absl::Status bound = os_.NumaRunOnNode(node_);
    if (!bound.ok()) {
      MutexLock lock(&mu_);
      if (!warned_bind_) {
        warned_bind_ = true;
        LOG(WARNING) << "Cannot bind pre-fault threads to NUMA node " << node_
                     << ": " << bound << "; pre-faulting unbound";
      }
    }
    for (;;) {
      if (failed_.load(std::memory_order_relaxed)) break;
      const uint64_t offset =
          next_offset_.fetch_add(chunk_, std::memory_order_relaxed);
      if (offset >= length_) break;
      const uint64_t len = std::min(chunk_, length_ - offset);
      absl::Status status = Populate(base_ + offset, len);
      if (!status.ok()) {
        Fail(status);
        break;
      }
      done_bytes_.fetch_add(len, std::memory_order_relaxed);
    }
    MutexLock lock(&mu_);
    ++finished_;
    finished_cv_.SignalAll();
  }

  // True when every started worker has finished within `timeout`.
  bool WaitForWorkers(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (finished_ != spawned_) {
      if (finished_cv_.WaitWithDeadline(&mu_, deadline)) {
        return finished_ == spawned_;
      }
    }
    return true;
  }

  absl::Status Populate(char* p, uint64_t len) {
    if (!touch_fallback_.load(std::memory_order_relaxed)) {
      absl::Status s = os_.Madvise(p, len, MADV_POPULATE_WRITE);
      if (s.ok()) return s;
      if (s.code() != absl::StatusCode::kInvalidArgument) return s;
      // Kernels before 5.14 do not know MADV_POPULATE_WRITE.
      touch_fallback_.store(true, std::memory_order_relaxed);
    }
    for (uint64_t off = 0; off < len; off += kSmallPage) {
      reinterpret_cast<volatile char*>(p)[off] = 0;
    }
    return absl::OkStatus();
  }

  void Fail(const absl::Status& status) {
    MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = status;
    failed_.store(true, std::memory_order_relaxed);
  }

 private:
  Os& os_;
  char* const base_;
  const uint64_t length_;
  const uint64_t chunk_;
  const int node_;
  std::atomic<uint64_t> next_offset_{0};
  std::atomic<uint64_t> done_bytes_{0};
  std::atomic<bool> failed_{false};
  std::atomic<bool> touch_fallback_{false};
  Mutex mu_;
  int spawned_ ABSL_GUARDED_BY(mu_) = -1;  // -1 until all are started
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar finished_cv_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  bool warned_bind_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::string_view PageKindName(PageKind kind) {
  switch (kind) {
    case PageKind::k4K:
      return "4k";
    case PageKind::kThp:
      return "thp";
    case PageKind::kHugetlb:
      return "hugetlb";
  }
  return "4k";
}

std::string PageKindDescription(PageKind kind, uint64_t page_bytes) {
  switch (kind) {
    case PageKind::k4K:
      return "4 KiB pages";
    case PageKind::kThp:
      return "transparent huge pages";
    case PageKind::kHugetlb:
      return absl::StrCat("hugetlb ", HumanReadableBytes(page_bytes), " pages");
  }
  return "4 KiB pages";
}

absl::StatusOr<std::unique_ptr<PremappedRegion>> PremappedRegion::Create(
    const Options& options, Os* os, FaultInjector* faults,
    std::optional<int> device_numa_node,
    const DmaRegistration& register_for_dma) {
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
  Prefaulter prefaulter(*os, static_cast<char*>(range.start), range.length,
                        range.plan.page_bytes, node);
  const int threads = prefaulter.ThreadsFor(
      options.EffectivePrefaultThreads(os->OnlineCpuCount()));
  TPUSHIM_RETURN_IF_ERROR(prefaulter.Run(threads));
  if (locked) {
    LOG(INFO) << "mlock()-ed " << range.length
              << " bytes for premapped region, using " << mlock_syscalls
              << " syscalls.";
  }
  // 6. Register with the devices (nothing can fail after this step).
  if (register_for_dma) {
    TPUSHIM_RETURN_IF_ERROR(register_for_dma(range.start, size));
  }

  const absl::Duration elapsed =
      absl::Nanoseconds(os->MonotonicNanos() - start_ns);
  LOG(INFO) << "Done premapping memory of size " << size << " in "
            << absl::StrFormat("%.3f", absl::ToDoubleSeconds(elapsed)) << "s ("
            << PageKindDescription(range.plan.kind, range.plan.page_bytes)
            << ", " << threads << " threads, NUMA node " << node << ")";

  auto allocator = std::make_unique<RegionAllocator>(
      range.start, size,
      RegionAllocator::Config{.threshold = threshold,
                              .dump_on_oom = options.dump_on_oom.value,
                              .faults = faults});
  Stats stats;
  stats.page_kind = range.plan.kind;
  stats.page_bytes = range.plan.page_bytes;
  stats.numa_node = node;
  stats.prefault_threads = threads;
  stats.locked = locked;
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
  if (startup_stats_.locked) {
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
