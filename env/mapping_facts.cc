#include "env/mapping_facts.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace tpushim {
namespace {

// "7f0000000000-7f0000200000 rw-p ...": the mapping's range, if `line`
// is a mapping's header line.
bool ParseHeader(absl::string_view line, uint64_t* begin, uint64_t* end) {
  const size_t space = line.find(' ');
  if (space == absl::string_view::npos) return false;
  const absl::string_view range = line.substr(0, space);
  const size_t dash = range.find('-');
  if (dash == absl::string_view::npos) return false;
  return absl::SimpleHexAtoi(range.substr(0, dash), begin) &&
         absl::SimpleHexAtoi(range.substr(dash + 1), end) && *begin < *end;
}

// "Rss:  1024 kB" -> bytes.
bool ParseKb(absl::string_view value, uint64_t* bytes) {
  value = absl::StripAsciiWhitespace(value);
  if (!absl::ConsumeSuffix(&value, " kB")) return false;
  uint64_t kb = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &kb)) return false;
  *bytes = kb * 1024;
  return true;
}

struct Mapping {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t rss = 0, anon_huge = 0, hugetlb = 0, locked = 0, page = 0;
  std::vector<absl::string_view> flags;
};

}  // namespace

absl::StatusOr<MappingFacts> ParseMappingFacts(absl::string_view smaps,
                                               const void* addr,
                                               uint64_t length) {
  const uint64_t lo = reinterpret_cast<uintptr_t>(addr);
  const uint64_t hi = lo + length;
  std::vector<Mapping> overlapping;
  Mapping* current = nullptr;
  bool any_header = false;
  for (absl::string_view line : absl::StrSplit(smaps, '\n')) {
    uint64_t begin = 0, end = 0;
    if (ParseHeader(line, &begin, &end)) {
      any_header = true;
      current = nullptr;
      if (begin < hi && lo < end) {
        Mapping m;
        m.begin = begin;
        m.end = end;
        overlapping.push_back(std::move(m));
        current = &overlapping.back();
      }
      continue;
    }
    if (current == nullptr) continue;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view key = line.substr(0, colon);
    const absl::string_view value = line.substr(colon + 1);
    uint64_t bytes = 0;
    if (key == "VmFlags") {
      current->flags = absl::StrSplit(value, ' ', absl::SkipEmpty());
    } else if (!ParseKb(value, &bytes)) {
      continue;
    } else if (key == "Rss") {
      current->rss = bytes;
    } else if (key == "AnonHugePages") {
      current->anon_huge = bytes;
    } else if (key == "Private_Hugetlb" || key == "Shared_Hugetlb") {
      current->hugetlb += bytes;
    } else if (key == "Locked") {
      current->locked = bytes;
    } else if (key == "KernelPageSize") {
      current->page = bytes;
    }
  }
  if (!any_header) {
    return absl::InvalidArgumentError("not smaps text: no mapping header");
  }
  if (overlapping.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "no mapping covers [%p, +%d) in smaps", addr, length));
  }
  MappingFacts facts;
  facts.huge_advised = facts.no_huge_advised = facts.lock_flag =
      facts.hugetlb_flag = true;
  for (const Mapping& m : overlapping) {
    const uint64_t size = m.end - m.begin;
    const uint64_t overlap = std::min(m.end, hi) - std::max(m.begin, lo);
    // A mapping that only partly overlaps counts its share.
    auto share = [&](uint64_t bytes) {
      return overlap == size
                 ? bytes
                 : static_cast<uint64_t>(static_cast<double>(bytes) *
                                         static_cast<double>(overlap) /
                                         static_cast<double>(size));
    };
    facts.mapped_bytes += overlap;
    facts.resident_bytes += share(m.rss);
    facts.anon_huge_bytes += share(m.anon_huge);
    facts.hugetlb_bytes += share(m.hugetlb);
    facts.locked_bytes += share(m.locked);
    facts.kernel_page_bytes = std::max(facts.kernel_page_bytes, m.page);
    auto has = [&](absl::string_view flag) {
      return std::find(m.flags.begin(), m.flags.end(), flag) != m.flags.end();
    };
    facts.huge_advised &= has("hg");
    facts.no_huge_advised &= has("nh");
    facts.lock_flag &= has("lo");
    facts.hugetlb_flag &= has("ht");
    ++facts.mappings;
  }
  return facts;
}

absl::StatusOr<MappingFacts> ReadMappingFacts(Os& os, const void* addr,
                                              uint64_t length) {
  TPUSHIM_ASSIGN_OR_RETURN(const std::string smaps,
                           os.ReadFile("/proc/self/smaps"));
  return ParseMappingFacts(smaps, addr, length);
}

}  // namespace tpushim
