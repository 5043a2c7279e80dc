#include "allocator/region_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <numaif.h>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/human_bytes.h"
#include "common/status_macros.h"
#include "env/mapping_facts.h"
#include "logging/log.h"

namespace tpushim {
namespace {

constexpr uint64_t kSmallPage = 4096;
constexpr uint64_t kHugePage = uint64_t{2} << 20;
// Pages whose node is looked up to see where the region's memory is.
constexpr uint64_t kNodeSamples = 64;

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::string PolicyName(int mode) {
  switch (mode) {
    case MPOL_DEFAULT:
      return "default";
    case MPOL_PREFERRED:
      return "preferred";
    case MPOL_BIND:
      return "bind";
    case MPOL_INTERLEAVE:
      return "interleave";
    case MPOL_LOCAL:
      return "local";
    default:
      return absl::StrCat("mode ", mode);
  }
}

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


ObservedPages ObservePages(Os& os, const MappedRange& range,
                           bool lock_succeeded) {
  ObservedPages seen;
  seen.kind = range.plan.kind;
  seen.page_bytes = range.plan.page_bytes;
  seen.huge_bytes = range.plan.kind == PageKind::k4K ? 0 : range.length;
  seen.locked_bytes = lock_succeeded ? range.length : 0;
  absl::StatusOr<MappingFacts> facts =
      ReadMappingFacts(os, range.start, range.length);
  if (facts.ok()) {
    seen.known = true;
    if (facts->hugetlb_flag || facts->kernel_page_bytes > kSmallPage) {
      seen.kind = PageKind::kHugetlb;
      seen.page_bytes = facts->kernel_page_bytes;
      seen.huge_bytes = facts->mapped_bytes;
      // smaps counts no hugetlb page as Locked; they never swap, and the
      // mapping carries the lock flag when the mlock took.
      seen.locked_bytes = facts->lock_flag ? facts->mapped_bytes : 0;
    } else {
      seen.kind = facts->anon_huge_bytes > 0 ? PageKind::kThp : PageKind::k4K;
      seen.page_bytes = seen.kind == PageKind::kThp ? kHugePage : kSmallPage;
      seen.huge_bytes = facts->anon_huge_bytes;
      seen.locked_bytes = facts->locked_bytes;
    }
  } else {
    LOG(WARNING) << "Cannot read back how the premapped region is backed ("
                 << facts.status() << "); reporting what was asked for";
  }
  seen.description = PageKindDescription(seen.kind, seen.page_bytes);
  if (seen.known && seen.kind == PageKind::kThp &&
      seen.huge_bytes < range.length) {
    seen.description = absl::StrCat(
        "transparent huge pages on ",
        seen.huge_bytes * 100 / range.length,
        "% of the region, 4 KiB pages on the rest");
  } else if (seen.known && seen.kind == PageKind::k4K &&
             range.plan.kind == PageKind::kThp) {
    seen.description =
        "4 KiB pages (transparent huge pages advised but not given)";
  }

  absl::StatusOr<Os::MemoryPolicy> policy = os.MemoryPolicyOf(range.start);
  if (policy.ok()) seen.numa_policy = PolicyName(policy->mode);
  std::vector<const void*> pages;
  const uint64_t stride =
      std::max<uint64_t>(kSmallPage,
                         RoundUp(range.length / kNodeSamples, kSmallPage));
  for (uint64_t off = 0; off < range.length; off += stride) {
    pages.push_back(static_cast<const char*>(range.start) + off);
  }
  absl::StatusOr<std::vector<int>> nodes = os.NodesOfPages(pages);
  if (nodes.ok()) {
    std::set<int> found;
    for (int n : *nodes) {
      if (n >= 0) found.insert(n);
    }
    seen.numa_nodes.assign(found.begin(), found.end());
  }
  return seen;
}

}  // namespace tpushim
