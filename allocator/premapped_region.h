// PremappedRegion: the host region devices DMA to and from, mapped,
// pre-faulted and pinned once at start-up (TPU_PREMAPPED_BUFFER_SIZE), and
// the exact-size allocator over it.
//
// Start-up, in order, each step through the Os layer (so every call can be
// made to fail) and each undone if a later one fails:
//   1. checks before touching memory: the size against MemAvailable and the
//      cgroup limit (RESOURCE_EXHAUSTED naming both numbers — pre-faulting
//      must never get this process OOM-killed), the memlock limit without
//      CAP_IPC_LOCK (WARNING, or RESOURCE_EXHAUSTED under
//      TPUSHIM_MLOCK=required), huge pages asked for but not available;
//   2. mmap, 4 KiB-aligned, or 2 MiB-aligned with huge pages
//      (TPUSHIM_HUGEPAGES: auto = hugetlb if enough pages are reserved, else
//      THP through MADV_HUGEPAGE if the kernel allows it, else 4 KiB);
//   3. mbind to the NUMA node (TPUSHIM_NUMA_NODE; auto = the device's node,
//      else the calling thread's) before any page is touched;
//   4. mlock per TPUSHIM_MLOCK, as MLOCK_ONFAULT so that the pre-fault
//      threads lock the pages as they populate them (on: failure is a
//      WARNING and the region stays unpinned; required: failure is an
//      error; off: skipped);
//   5. pre-fault with TPUSHIM_PREFAULT_THREADS threads, each bound to the
//      node's CPUs, using MADV_POPULATE_WRITE (a page-touch loop on kernels
//      without it), logging progress about once a second.
// It logs libtpu's start-up lines, from "TPU premapped buffer enabled." to
// "Done allocating premapped memory of size <bytes>", with their exact
// wording (log tools grep for them).
//
// With TPUSHIM_PREMAP=background, Create stops after step 4 and returns a
// region whose allocator serves nothing yet; StartPremapping() runs step 5
// (and the DMA registration, chunk by chunk) on a thread of its own, from
// the low end, growing what the allocator serves as each prefix is
// populated, locked and reachable by DMA. The lines from "Premapping
// memory:" on come from that thread, and so does every hook (the DMA
// extension of each step, progress), run outside the pre-faulter's lock
// while its workers populate the next chunks. A failure there is logged
// at ERROR and leaves the region usable up to where it got.
//
// Destruction stops the background work, then unpins and unmaps
// everything. REQUIRES: no allocation from the region is used after the
// region is destroyed.
//
// Thread-safety: thread-safe; StartPremapping is called once.
//
//   TPUSHIM_ASSIGN_OR_RETURN(std::unique_ptr<PremappedRegion> region,
//                            PremappedRegion::Create(options, os, faults));
//   if (region != nullptr) {  // null: TPU_PREMAPPED_BUFFER_SIZE=0
//     TPUSHIM_ASSIGN_OR_RETURN(void* p, region->allocator().Allocate(n));
//   }

#ifndef TPUSHIM_ALLOCATOR_PREMAPPED_REGION_H_
#define TPUSHIM_ALLOCATOR_PREMAPPED_REGION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "allocator/region_allocator.h"
#include "allocator/region_pages.h"
#include "common/mutex.h"
#include "env/fault_injection.h"
#include "env/options.h"
#include "env/os.h"

namespace tpushim {

class PremappedRegion {
 public:
  // What the region is, as the kernel reports it once it is premapped
  // (/proc/self/smaps, get_mempolicy, move_pages), not what was asked for.
  struct Stats {
    RegionAllocator::Stats allocator;
    PageKind page_kind = PageKind::k4K;  // what backs it
    uint64_t page_bytes = 4096;
    uint64_t huge_page_bytes = 0;  // on transparent or hugetlb huge pages
    PageKind page_kind_asked = PageKind::k4K;
    // As the start-up line says it, e.g. "transparent huge pages on 87% of
    // the region, 4 KiB pages on the rest".
    std::string page_description;
    int numa_node = 0;        // the node its pages are on (or were bound to)
    std::string numa_policy;  // "bind", "default", ... or "unknown"
    std::vector<int> numa_nodes;  // nodes its pages were found on
    int prefault_threads = 0;
    bool lock_requested = false;  // the mlock call succeeded
    // Whether the kernel holds the region locked, true at every moment:
    // the lock took (read back from the mapping's flags, so that an mlock
    // a sanitizer runtime swallows does not count) and, once the region
    // is premapped, the kernel holds all of it locked. Locked-on-fault is
    // locked: while a background region is premapped, each page is locked
    // as it is populated, so the region is locked from Create on.
    bool locked = false;
    // Bytes the kernel holds resident and locked: read back once the
    // region is premapped; before that (a background region being
    // premapped, or one whose premapping stopped short) the premapped
    // prefix, each page of which was locked as it was populated.
    uint64_t locked_bytes = 0;
    // Why the region is not locked: the memlock limit that kept the lock
    // from being tried, the failed mlock call's status, or what the kernel
    // holds after a call that succeeded. OK when it is locked and under
    // TPUSHIM_MLOCK=off (which does not try).
    absl::Status lock_error;
    // Until "Done allocating premapped memory": for a background region,
    // until the whole region was premapped (zero while it is not).
    absl::Duration startup_time;
    bool background = false;  // TPUSHIM_PREMAP=background
    // Bytes from the start that are premapped and served; the whole
    // region once premapping is done.
    uint64_t ready_bytes = 0;
    bool premapped = false;  // all of it
    // Why background premapping stopped short (OK while it runs or when
    // it finished).
    absl::Status premap_error;
  };

  // Makes the region reachable by the devices' DMA (IOMMU mappings): called
  // once the region is pinned and pre-faulted, before "Done premapping
  // memory", so its time counts as premapping. On error it must leave
  // nothing registered.
  using DmaRegistration =
      std::function<absl::Status(void* base, uint64_t size)>;
  // Told how many bytes of the region are populated (`done` of `total`)
  // while it is pre-faulted: each time the populated prefix grows, in
  // increasing order, never concurrently, always from the one thread that
  // drives pre-faulting (Create's caller in the foreground, the premapping
  // thread in the background) and with no lock of the region held, so
  // that the pre-fault workers go on while it runs. It must not call into
  // the region.
  using PrefaultProgress = std::function<void(uint64_t done, uint64_t total)>;

  // Maps, pre-faults and pins the region described by `options`, registers
  // it through `register_for_dma` (if given) and logs the start-up lines.
  // Returns null (after logging "TPU premapped buffer disabled.") when the
  // size is 0. `os` and `faults` (nullable) must outlive the region.
  // `device_numa_node` is the node of the device the region serves, if
  // known. On error nothing stays mapped, locked or registered.
  // With TPUSHIM_PREMAP=background, `register_for_dma` and `on_progress`
  // are not used: StartPremapping takes their place.
  static absl::StatusOr<std::unique_ptr<PremappedRegion>> Create(
      const Options& options, Os* os, FaultInjector* faults,
      std::optional<int> device_numa_node = std::nullopt,
      const DmaRegistration& register_for_dma = nullptr,
      const PrefaultProgress& on_progress = nullptr);

  // What the background work tells its owner. Every hook is called from
  // the premapping thread (one thread, the same for every call; never a
  // pre-fault worker), never concurrently and with no lock of the region
  // or its pre-faulter held: the workers go on populating the next chunks
  // while a hook runs. None may call into the region.
  struct BackgroundHooks {
    // Makes the first `ready` bytes reachable by the devices' DMA, before
    // the allocator serves them (increasing, the whole size last). An
    // error stops premapping there.
    std::function<absl::Status(uint64_t ready)> extend_dma;
    PrefaultProgress on_progress;
    // Once, when the work ends: OK when the whole region is premapped,
    // else why it stopped (CANCELLED by StopPremapping).
    std::function<void(const absl::Status&)> on_done;
  };
  // Starts premapping a background region behind the caller. REQUIRES:
  // background() and not called before.
  void StartPremapping(BackgroundHooks hooks);
  // Stops the background work where it is and waits for its thread (its
  // on_done has returned when this does). The allocator stops growing
  // first, so that an Allocate waiting for premapping returns (CANCELLED)
  // before this waits for the chunks in progress. Idempotent and
  // thread-safe; nothing in the foreground.
  void StopPremapping();
  // Blocks until background premapping has ended and returns how it did
  // (OK at once in the foreground).
  absl::Status WaitUntilPremapped();
  bool background() const { return background_ != nullptr; }

  PremappedRegion(const PremappedRegion&) = delete;
  PremappedRegion& operator=(const PremappedRegion&) = delete;
  ~PremappedRegion();

  void* base() const { return allocator_->base(); }
  uint64_t size() const { return allocator_->capacity(); }
  RegionAllocator& allocator() { return *allocator_; }
  const RegionAllocator& allocator() const { return *allocator_; }

  Stats GetStats() const;

 private:
  // What steps 1-4 leave for pre-faulting.
  struct Prepared {
    MappedRange range;
    uint64_t size = 0;
    int node = 0;
    bool locked = false;  // the mlock call succeeded
    // Why not: see Stats::lock_error.
    absl::Status lock_error;
    int mlock_syscalls = 0;
    int threads = 1;
    int64_t start_ns = 0;
  };
  struct Background;

  PremappedRegion(Os* os, const Prepared& prepared,
                  std::unique_ptr<RegionAllocator> allocator);
  // Step 5 onwards: pre-faults, reads back what the kernel did, logs the
  // start-up lines from "mlock()-ed" to "Done allocating premapped
  // memory" and records it in stats_. `on_ready` is told each populated
  // prefix; an error it returns stops pre-faulting.
  absl::Status Populate(
      const std::function<absl::Status(uint64_t ready)>& on_ready,
      const DmaRegistration& register_for_dma);
  void RunBackground();
  // The end of background premapping, however it ends: the allocator
  // stops growing (or is whole), the end is logged and told to on_done,
  // and WaitUntilPremapped returns.
  void FinishBackground(const absl::Status& status);

  // Constant after construction.
  Os* const os_;
  const Prepared prepared_;
  std::unique_ptr<RegionAllocator> allocator_;
  std::unique_ptr<Background> background_;  // null in the foreground

  mutable Mutex mu_;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpushim

#endif  // TPUSHIM_ALLOCATOR_PREMAPPED_REGION_H_
