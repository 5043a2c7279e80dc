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
// Destruction unpins and unmaps everything. REQUIRES: no allocation from
// the region is used after the region is destroyed.
//
// Thread-safety: the object is immutable after Create except for its
// allocator, which is thread-safe.
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

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "allocator/region_allocator.h"
#include "allocator/region_pages.h"
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
    uint64_t locked_bytes = 0;    // bytes the kernel holds locked
    bool locked = false;          // all of it
    absl::Duration startup_time;
  };

  // Makes the region reachable by the devices' DMA (IOMMU mappings): called
  // once the region is pinned and pre-faulted, before "Done premapping
  // memory", so its time counts as premapping. On error it must leave
  // nothing registered.
  using DmaRegistration =
      std::function<absl::Status(void* base, uint64_t size)>;
  // Told how many bytes of the region are populated (`done` of `total`)
  // while it is pre-faulted: each time the populated prefix grows, in
  // increasing order, never concurrently, from a pre-fault thread. It must
  // not call into the region.
  using PrefaultProgress = std::function<void(uint64_t done, uint64_t total)>;

  // Maps, pre-faults and pins the region described by `options`, registers
  // it through `register_for_dma` (if given) and logs the start-up lines.
  // Returns null (after logging "TPU premapped buffer disabled.") when the
  // size is 0. `os` and `faults` (nullable) must outlive the region.
  // `device_numa_node` is the node of the device the region serves, if
  // known. On error nothing stays mapped, locked or registered.
  static absl::StatusOr<std::unique_ptr<PremappedRegion>> Create(
      const Options& options, Os* os, FaultInjector* faults,
      std::optional<int> device_numa_node = std::nullopt,
      const DmaRegistration& register_for_dma = nullptr,
      const PrefaultProgress& on_progress = nullptr);

  PremappedRegion(const PremappedRegion&) = delete;
  PremappedRegion& operator=(const PremappedRegion&) = delete;
  ~PremappedRegion();

  void* base() const { return allocator_->base(); }
  uint64_t size() const { return allocator_->capacity(); }
  RegionAllocator& allocator() { return *allocator_; }
  const RegionAllocator& allocator() const { return *allocator_; }

  Stats GetStats() const;

 private:
  struct Mapping;
  PremappedRegion(Os* os, void* mapping, uint64_t mapping_bytes,
                  std::unique_ptr<RegionAllocator> allocator, Stats stats);

  // Constant after construction.
  Os* const os_;
  void* const mapping_;  // what mmap returned after alignment trimming
  const uint64_t mapping_bytes_;
  std::unique_ptr<RegionAllocator> allocator_;
  const Stats startup_stats_;
};

}  // namespace tpushim

#endif  // TPUSHIM_ALLOCATOR_PREMAPPED_REGION_H_
