// How the premapped region is backed: the page kind asked for
// (TPUSHIM_HUGEPAGES and what the host offers), the mapping made for it,
// and what the kernel actually gave — read back from the kernel, not
// assumed from the calls that succeeded.
//
// Thread-safety: pure functions over the OS layer.
//
//   const PagePlan plan = ChoosePages(options.hugepages.value, facts, size);
//   TPUSHIM_ASSIGN_OR_RETURN(MappedRange range,
//                            MapRegion(os, size, plan, mode));
//   ... bind, lock, pre-fault ...
//   const ObservedPages seen = ObservePages(os, range, locked, node);

#ifndef TPUSHIM_ALLOCATOR_REGION_PAGES_H_
#define TPUSHIM_ALLOCATOR_REGION_PAGES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "env/host_facts.h"
#include "env/options.h"
#include "env/os.h"

namespace tpushim {

enum class PageKind { k4K, kThp, kHugetlb };
// "4k", "thp", "hugetlb" (for JSON and stats).
absl::string_view PageKindName(PageKind kind);
// "4 KiB pages", "transparent huge pages", "hugetlb 2.00M pages" (the
// hugetlb size is the pool's).
std::string PageKindDescription(PageKind kind, uint64_t page_bytes);

// How the region is to be backed.
struct PagePlan {
  PageKind kind = PageKind::k4K;
  uint64_t page_bytes = 4096;
};

// The backing TPUSHIM_HUGEPAGES asks for, given what the host offers. The
// host checks have already refused an explicit mode the host cannot serve.
PagePlan ChoosePages(HugePagesMode mode, const HostFacts& facts,
                     uint64_t size);

// A mapping for the region: its page-aligned start (2 MiB-aligned for huge
// pages), its length (the size rounded up to the page size) and the plan
// it was made for (after any fallback).
struct MappedRange {
  void* start = nullptr;
  uint64_t length = 0;
  PagePlan plan;
};

// Maps `bytes` per `plan` (MAP_HUGETLB for hugetlb; MADV_HUGEPAGE on a
// 2 MiB-aligned mapping for THP, trimming the slack used to align it).
// Under `auto` a failed hugetlb mapping falls back to THP and a failed
// MADV_HUGEPAGE to 4 KiB pages; otherwise the failure is returned, with
// nothing left mapped.
absl::StatusOr<MappedRange> MapRegion(Os& os, uint64_t bytes, PagePlan plan,
                                      HugePagesMode mode);

// What the kernel did with the mapping once it is populated.
struct ObservedPages {
  // Whether /proc/self/smaps could be read; when not, the fields below
  // repeat the plan and `locked_bytes` is the whole mapping when the
  // mlock call succeeded.
  bool known = false;
  PageKind kind = PageKind::k4K;
  uint64_t page_bytes = 4096;
  // Bytes on huge pages: transparent (AnonHugePages) or hugetlb.
  uint64_t huge_bytes = 0;
  // Bytes the kernel holds locked (smaps' Locked; the whole mapping for a
  // locked hugetlb mapping, whose pages are never swapped anyway).
  uint64_t locked_bytes = 0;
  // The memory policy at the region's start ("bind", "default", ...,
  // "unknown" without NUMA support) and the nodes its pages were found on
  // (a sample of up to 64 pages).
  std::string numa_policy = "unknown";
  std::vector<int> numa_nodes;
  // For the "Done premapping memory" line, e.g. "transparent huge pages",
  // "transparent huge pages on 87% of the region, 4 KiB pages on the
  // rest", "4 KiB pages (transparent huge pages advised but not given)".
  std::string description;
};

// Reads back what backs the mapping. `lock_succeeded`: the mlock call
// returned success. Never fails: what cannot be read is reported as
// unknown (and logged at WARNING once by the caller's choice).
ObservedPages ObservePages(Os& os, const MappedRange& range,
                           bool lock_succeeded);

}  // namespace tpushim

#endif  // TPUSHIM_ALLOCATOR_REGION_PAGES_H_
