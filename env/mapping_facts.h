// MappingFacts: what the kernel actually did with a range of this
// process's memory — the page size backing it, how much of it sits on
// transparent or hugetlb huge pages, how much is resident and locked, and
// which advice it carries — read from /proc/self/smaps through the OS
// layer. The premapped region reports these, not what it asked for: an
// MADV_HUGEPAGE the kernel could not honour, or an mlock a sanitizer
// runtime swallowed, shows up as what it is.
//
// Thread-safety: a pure function of what the OS layer returns.
//
//   TPUSHIM_ASSIGN_OR_RETURN(MappingFacts facts,
//                            ReadMappingFacts(*os, base, size));
//   if (facts.anon_huge_bytes == 0) { ... no transparent huge page ... }

#ifndef TPUSHIM_ENV_MAPPING_FACTS_H_
#define TPUSHIM_ENV_MAPPING_FACTS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "env/os.h"

namespace tpushim {

struct MappingFacts {
  uint64_t mapped_bytes = 0;     // of the range, covered by mappings
  uint64_t resident_bytes = 0;   // Rss
  uint64_t anon_huge_bytes = 0;  // AnonHugePages: transparent huge pages
  uint64_t hugetlb_bytes = 0;    // Private_ and Shared_Hugetlb
  uint64_t locked_bytes = 0;     // Locked
  // KernelPageSize: the page size the mappings are made of (2 MiB or
  // 1 GiB for hugetlb; 4 KiB for anonymous memory, THP included). The
  // largest when the range spans mappings of several.
  uint64_t kernel_page_bytes = 0;
  // VmFlags on every mapping of the range: "hg" (MADV_HUGEPAGE), "nh"
  // (MADV_NOHUGEPAGE), "lo" (mlock'ed, or to be locked on fault), "ht"
  // (hugetlb).
  bool huge_advised = false;
  bool no_huge_advised = false;
  bool lock_flag = false;
  bool hugetlb_flag = false;
  int mappings = 0;  // how many of the process's mappings the range spans
};

// Parses smaps text (the format of /proc/<pid>/smaps) for the mappings
// that overlap [addr, addr + length). Byte counts of a mapping that only
// partly overlaps the range are scaled to the overlap. INVALID_ARGUMENT
// when no mapping overlaps the range or the text is not smaps.
absl::StatusOr<MappingFacts> ParseMappingFacts(absl::string_view smaps,
                                               const void* addr,
                                               uint64_t length);

// ParseMappingFacts of /proc/self/smaps read through `os`.
absl::StatusOr<MappingFacts> ReadMappingFacts(Os& os, const void* addr,
                                              uint64_t length);

}  // namespace tpushim

#endif  // TPUSHIM_ENV_MAPPING_FACTS_H_
