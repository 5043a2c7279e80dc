#include "env/host_facts.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/human_bytes.h"
#include "common/status_macros.h"

namespace tpushim {
namespace {

constexpr char kMeminfoPath[] = "/proc/meminfo";
constexpr char kProcCgroupPath[] = "/proc/self/cgroup";
constexpr char kThpDir[] = "/sys/kernel/mm/transparent_hugepage";
constexpr char kHugepagesDir[] = "/sys/kernel/mm/hugepages";
constexpr uint64_t kDefaultHugePageBytes = uint64_t{2} << 20;

// ---- Small parsers ---------------------------------------------------------

// A decimal unsigned number surrounded by optional whitespace.
std::optional<uint64_t> ParseUint(absl::string_view text) {
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value)) {
    return std::nullopt;
  }
  return value;
}

// A file holding one decimal number; nullopt when unreadable or malformed.
std::optional<uint64_t> ReadUintFile(Os& os, const std::string& path) {
  absl::StatusOr<std::string> text = os.ReadFile(path);
  if (!text.ok()) return std::nullopt;
  return ParseUint(*text);
}

// The value of `key` in a "key value" file such as memory.stat.
std::optional<uint64_t> FindKeyedValue(absl::string_view text,
                                       absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    if (kv.first == key) return ParseUint(kv.second);
  }
  return std::nullopt;
}

// The bracketed word of a sysfs choice file: "always [madvise] never" ->
// "madvise"; "" when there is none.
std::string BracketedWord(absl::string_view text) {
  const size_t open = text.find('[');
  if (open == absl::string_view::npos) return "";
  const size_t close = text.find(']', open);
  if (close == absl::string_view::npos) return "";
  return std::string(text.substr(open + 1, close - open - 1));
}

// ---- /proc/meminfo ---------------------------------------------------------

absl::Status ReadMeminfo(Os& os, HostFacts& facts) {
  absl::StatusOr<std::string> text = os.ReadFile(kMeminfoPath);
  if (!text.ok()) {
    return absl::InternalError(absl::StrCat("cannot read ", kMeminfoPath, ": ",
                                            text.status().ToString()));
  }
  std::optional<uint64_t> total_kb;
  std::optional<uint64_t> available_kb;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    absl::ConsumeSuffix(&value, "kB");
    if (kv.first == "MemTotal") total_kb = ParseUint(value);
    if (kv.first == "MemAvailable") available_kb = ParseUint(value);
  }
  if (!total_kb.has_value()) {
    return absl::InternalError(
        absl::StrCat(kMeminfoPath, " has no readable MemTotal line"));
  }
  if (!available_kb.has_value()) {
    return absl::InternalError(
        absl::StrCat(kMeminfoPath,
                     " has no readable MemAvailable line (Linux 3.14 or "
                     "later is required)"));
  }
  facts.mem_total_bytes = *total_kb * 1024;
  facts.mem_available_bytes = *available_kb * 1024;
  return absl::OkStatus();
}

// ---- cgroups ---------------------------------------------------------------

std::optional<uint64_t> ParseV2Limit(absl::string_view text) {
  // "max" is unlimited; ParseUint rejects it.
  return ParseUint(text);
}

std::optional<uint64_t> ParseV1Limit(absl::string_view text) {
  // v1 writes "unlimited" as PAGE_COUNTER_MAX pages, rounded down to a page
  // (9223372036854771712 on x86-64); anything this large is no limit.
  constexpr uint64_t kV1Unlimited = uint64_t{1} << 62;
  std::optional<uint64_t> limit = ParseUint(text);
  if (limit.has_value() && *limit >= kV1Unlimited) return std::nullopt;
  return limit;
}

// Where one cgroup version keeps its memory controller's files.
struct MemoryHierarchy {
  int version;
  absl::string_view mount;          // root directory of the hierarchy
  absl::string_view limit_file;     // memory.max / memory.limit_in_bytes
  absl::string_view usage_file;     // memory.current / memory.usage_in_bytes
  absl::string_view inactive_file;  // memory.stat key: inactive page cache
  // The limit written in `limit_file`; nullopt when it means "unlimited".
  std::optional<uint64_t> (*parse_limit)(absl::string_view text);
};

constexpr MemoryHierarchy kV2Hierarchy = {2,
                                          "/sys/fs/cgroup",
                                          "memory.max",
                                          "memory.current",
                                          "inactive_file",
                                          &ParseV2Limit};
constexpr MemoryHierarchy kV1Hierarchy = {1,
                                          "/sys/fs/cgroup/memory",
                                          "memory.limit_in_bytes",
                                          "memory.usage_in_bytes",
                                          "total_inactive_file",
                                          &ParseV1Limit};

// This process's membership in the hierarchy that holds the memory
// controller, from /proc/self/cgroup.
struct CgroupMembership {
  const MemoryHierarchy* hierarchy = nullptr;
  std::string path;
};

// A v1 line naming the `memory` controller wins: on hybrid hosts the
// unified (v2) hierarchy exists too but has no memory controller. A v2
// `0::<path>` line counts only when the v2 root offers the memory
// controller (otherwise /sys/fs/cgroup is a v1 tmpfs or memory is not
// delegated).
std::optional<CgroupMembership> FindMemoryCgroup(Os& os) {
  absl::StatusOr<std::string> text = os.ReadFile(kProcCgroupPath);
  if (!text.ok()) return std::nullopt;
  std::optional<std::string> v2_path;
  for (absl::string_view line :
       absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    // hierarchy-ID:controller-list:path; the path may itself hold ':'.
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3 || fields[2].empty()) continue;
    if (fields[0] == "0" && fields[1].empty()) {
      v2_path = std::string(fields[2]);
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "memory") {
        return CgroupMembership{&kV1Hierarchy, std::string(fields[2])};
      }
    }
  }
  if (!v2_path.has_value()) return std::nullopt;
  absl::StatusOr<std::string> controllers =
      os.ReadFile(absl::StrCat(kV2Hierarchy.mount, "/cgroup.controllers"));
  if (!controllers.ok()) return std::nullopt;
  for (absl::string_view c : absl::StrSplit(
           *controllers, absl::ByAnyChar(" \t\n"), absl::SkipEmpty())) {
    if (c == "memory") return CgroupMembership{&kV2Hierarchy, *v2_path};
  }
  return std::nullopt;
}

// The directory of `path` in `hierarchy`, or the hierarchy's root when it
// is not visible there: inside a container without a cgroup namespace,
// /proc/self/cgroup names the host's path while /sys/fs/cgroup shows the
// container's own cgroup as the root. Paths outside the namespace root
// ("/../x") fall back the same way.
std::string CgroupDirectory(Os& os, const MemoryHierarchy& hierarchy,
                            absl::string_view path) {
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return std::string(hierarchy.mount);
  }
  absl::string_view relative = absl::StripSuffix(path, "/");
  if (relative.empty()) return std::string(hierarchy.mount);
  std::string dir = absl::StrCat(hierarchy.mount, relative);
  absl::StatusOr<FileInfo> info = os.Stat(dir);
  if (!info.ok() || info->type != FileInfo::Type::kDirectory) {
    return std::string(hierarchy.mount);
  }
  return dir;
}

void ReadCgroup(Os& os, HostFacts& facts) {
  std::optional<CgroupMembership> membership = FindMemoryCgroup(os);
  if (!membership.has_value()) return;
  const MemoryHierarchy& hierarchy = *membership->hierarchy;
  facts.cgroup_version = hierarchy.version;
  facts.cgroup_path = membership->path;

  const std::string leaf = CgroupDirectory(os, hierarchy, membership->path);
  facts.cgroup_memory_usage_bytes =
      ReadUintFile(os, absl::StrCat(leaf, "/", hierarchy.usage_file));

  // Walk from the leaf up to the root of the hierarchy, inclusive.
  std::string dir = leaf;
  for (;;) {
    absl::StatusOr<std::string> limit_text =
        os.ReadFile(absl::StrCat(dir, "/", hierarchy.limit_file));
    std::optional<uint64_t> limit =
        limit_text.ok() ? hierarchy.parse_limit(*limit_text) : std::nullopt;
    if (limit.has_value()) {
      if (!facts.cgroup_memory_limit_bytes.has_value() ||
          *limit < *facts.cgroup_memory_limit_bytes) {
        facts.cgroup_memory_limit_bytes = limit;
      }
      // An ancestor's usage covers its whole subtree, so it is at least the
      // leaf's; the leaf's stands in when the ancestor's is unreadable.
      uint64_t usage =
          ReadUintFile(os, absl::StrCat(dir, "/", hierarchy.usage_file))
              .value_or(facts.cgroup_memory_usage_bytes.value_or(0));
      absl::StatusOr<std::string> stat =
          os.ReadFile(absl::StrCat(dir, "/memory.stat"));
      if (stat.ok()) {
        usage -= std::min(
            usage, FindKeyedValue(*stat, hierarchy.inactive_file).value_or(0));
      }
      const uint64_t headroom = *limit - std::min(usage, *limit);
      if (!facts.cgroup_memory_headroom_bytes.has_value() ||
          headroom < *facts.cgroup_memory_headroom_bytes) {
        facts.cgroup_memory_headroom_bytes = headroom;
      }
    }
    if (dir.size() <= hierarchy.mount.size()) break;
    dir.resize(dir.rfind('/'));
  }
}

// ---- Huge pages, NUMA ------------------------------------------------------

void ReadHugePages(Os& os, HostFacts& facts) {
  facts.thp_enabled = BracketedWord(
      os.ReadFile(absl::StrCat(kThpDir, "/enabled")).value_or(""));
  facts.thp_defrag =
      BracketedWord(os.ReadFile(absl::StrCat(kThpDir, "/defrag")).value_or(""));

  absl::StatusOr<std::vector<std::string>> entries =
      os.ListDirectory(kHugepagesDir);
  if (!entries.ok()) return;
  for (const std::string& entry : *entries) {
    absl::string_view name = entry;
    uint64_t page_kb = 0;
    if (!absl::ConsumePrefix(&name, "hugepages-") ||
        !absl::ConsumeSuffix(&name, "kB") ||
        !absl::SimpleAtoi(name, &page_kb) || page_kb == 0) {
      continue;
    }
    const std::string dir = absl::StrCat(kHugepagesDir, "/", entry, "/");
    std::optional<uint64_t> total = ReadUintFile(os, dir + "nr_hugepages");
    std::optional<uint64_t> free = ReadUintFile(os, dir + "free_hugepages");
    std::optional<uint64_t> reserved = ReadUintFile(os, dir + "resv_hugepages");
    if (!total.has_value() || !free.has_value() || !reserved.has_value()) {
      continue;
    }
    facts.hugepage_pools.push_back(
        HostFacts::HugePagePool{page_kb * 1024, *total, *free, *reserved});
  }
  std::sort(
      facts.hugepage_pools.begin(), facts.hugepage_pools.end(),
      [](const HostFacts::HugePagePool& a, const HostFacts::HugePagePool& b) {
        return a.page_bytes < b.page_bytes;
      });
}

void ReadNuma(Os& os, HostFacts& facts) {
  const int count = os.NumaNodeCount();
  for (int node = 0; node < count; ++node) {
    absl::StatusOr<Os::NumaNodeMemory> memory = os.NumaMemoryOfNode(node);
    if (!memory.ok()) continue;
    facts.numa_nodes.push_back(
        HostFacts::NumaNode{node, memory->total_bytes, memory->free_bytes});
  }
}

// ---- Checks ----------------------------------------------------------------

// Pages of the pool that no mapping has claimed yet: free_hugepages counts
// reserved-but-untouched pages too.
uint64_t UnclaimedPages(const HostFacts::HugePagePool& pool) {
  return pool.free_pages - std::min(pool.reserved_pages, pool.free_pages);
}

uint64_t PagesFor(uint64_t bytes, const HostFacts::HugePagePool& pool) {
  return bytes / pool.page_bytes + (bytes % pool.page_bytes != 0 ? 1 : 0);
}

bool SomePoolHolds(const HostFacts& facts, uint64_t bytes) {
  return facts.PoolFor(bytes).has_value();
}

std::string RegionSetting(uint64_t size) {
  return absl::StrCat("TPU_PREMAPPED_BUFFER_SIZE=",
                      BytesWithHumanReadable(size));
}

std::optional<HostClash> CheckMemory(const Options& options,
                                     const HostFacts& facts) {
  const uint64_t size = options.premapped_buffer_size.value;
  const HugePagesMode mode = options.hugepages.value;
  if (mode == HugePagesMode::kHugetlb ||
      (mode == HugePagesMode::kAuto && SomePoolHolds(facts, size))) {
    return std::nullopt;
  }
  // What other tpushim processes are still pinning is not available to us,
  // though MemAvailable does not show it yet.
  const uint64_t pending = facts.other_tpushim_pending_bytes;
  const uint64_t usable = facts.UsableMemoryBytes() > pending
                              ? facts.UsableMemoryBytes() - pending
                              : 0;
  const uint64_t headroom = MemoryHeadroomBytes(usable);
  if (size <= usable && usable - size >= headroom) return std::nullopt;
  const std::string others =
      facts.other_tpushim.empty()
          ? std::string()
          : absl::StrCat(
                " Other tpushim processes on this host: ",
                absl::StrJoin(facts.other_tpushim, ", "),
                pending > 0
                    ? absl::StrCat(" (", BytesWithHumanReadable(pending),
                                   " still to be pinned, counted as "
                                   "taken)")
                    : std::string(),
                ".");
  const std::string cgroup =
      facts.cgroup_memory_limit_bytes.has_value()
          ? absl::StrCat(
                "the cgroup memory limit is ",
                BytesWithHumanReadable(*facts.cgroup_memory_limit_bytes),
                " with ",
                BytesWithHumanReadable(
                    facts.cgroup_memory_usage_bytes.value_or(0)),
                " in use")
          : std::string("there is no cgroup memory limit");
  const uint64_t most = usable > headroom
                            ? (usable - headroom) / kPremappedSizeMultiple *
                                  kPremappedSizeMultiple
                            : 0;
  return HostClash{
      HostClash::Level::kError, HostClash::Check::kMemory,
      absl::StrCat("Cannot premap ", RegionSetting(size), ": MemAvailable is ",
                   BytesWithHumanReadable(facts.mem_available_bytes), " and ",
                   cgroup, ", and ", BytesWithHumanReadable(headroom),
                   " must stay free for everything else, so pre-faulting "
                   "would risk the OOM killer; set TPU_PREMAPPED_BUFFER_SIZE "
                   "to at most ",
                   most, " or free memory.", others)};
}

std::optional<HostClash> CheckMemlock(const Options& options,
                                      const HostFacts& facts) {
  const uint64_t size = options.premapped_buffer_size.value;
  // With the region off, the transfer engine's bounce pool is what pins.
  const uint64_t need = size > 0 ? size : kBouncePoolBytes;
  const MlockMode mode = options.mlock.value;
  if (mode == MlockMode::kOff || facts.CanLock(need)) return std::nullopt;
  const bool required = mode == MlockMode::kRequired;
  const std::string what =
      size > 0 ? RegionSetting(size)
               : absl::StrCat("the ", BytesWithHumanReadable(need),
                              " bounce pool the transfer engine pins when "
                              "the premapped region is off "
                              "(TPU_PREMAPPED_BUFFER_SIZE=0)");
  return HostClash{
      required ? HostClash::Level::kError : HostClash::Level::kWarning,
      HostClash::Check::kMemlock,
      absl::StrCat(
          "The RLIMIT_MEMLOCK soft limit of ",
          BytesWithHumanReadable(facts.memlock.soft), " is below ", what,
          " and the process lacks CAP_IPC_LOCK, so ",
          required   ? "start-up would fail because TPUSHIM_MLOCK=required"
          : size > 0 ? "the region would stay unpinned (slower transfers)"
                     : "the pool would stay unpinned (slower small transfers)",
          "; ", MemlockRaiseAdvice(facts.memlock, need),
          ", or set TPUSHIM_MLOCK=off.")};
}

std::optional<HostClash> CheckHugetlb(const Options& options,
                                      const HostFacts& facts) {
  const uint64_t size = options.premapped_buffer_size.value;
  if (options.hugepages.value != HugePagesMode::kHugetlb ||
      SomePoolHolds(facts, size)) {
    return std::nullopt;
  }
  if (facts.hugepage_pools.empty()) {
    return HostClash{
        HostClash::Level::kError, HostClash::Check::kHugetlb,
        absl::StrCat("TPUSHIM_HUGEPAGES=hugetlb but this kernel has no huge "
                     "page pools (",
                     kHugepagesDir,
                     " is empty or missing); set TPUSHIM_HUGEPAGES=auto or "
                     "thp.")};
  }
  // Suggest the 2 MiB pool where there is one, else the smallest.
  const HostFacts::HugePagePool* pool = &facts.hugepage_pools.front();
  for (const HostFacts::HugePagePool& p : facts.hugepage_pools) {
    if (p.page_bytes == kDefaultHugePageBytes) pool = &p;
  }
  const uint64_t needed = PagesFor(size, *pool);
  const uint64_t unclaimed = UnclaimedPages(*pool);
  const uint64_t page_kb = pool->page_bytes / 1024;
  return HostClash{
      HostClash::Level::kError, HostClash::Check::kHugetlb,
      absl::StrCat(
          "TPUSHIM_HUGEPAGES=hugetlb needs ", needed, " free ", page_kb,
          "kB huge pages for ", RegionSetting(size), " but only ", unclaimed,
          " are free and unreserved (and no other pool holds the region); "
          "reserve them with `echo ",
          pool->total_pages + needed - unclaimed, " | sudo tee ", kHugepagesDir,
          "/hugepages-", page_kb,
          "kB/nr_hugepages` or set TPUSHIM_HUGEPAGES=auto.")};
}

std::optional<HostClash> CheckThp(const Options& options,
                                  const HostFacts& facts) {
  if (options.hugepages.value != HugePagesMode::kThp) return std::nullopt;
  if (facts.thp_enabled.empty()) {
    return HostClash{HostClash::Level::kError, HostClash::Check::kThp,
                     "TPUSHIM_HUGEPAGES=thp but this kernel has no transparent "
                     "huge pages; set TPUSHIM_HUGEPAGES=auto or off."};
  }
  if (facts.thp_enabled != "never") return std::nullopt;
  return HostClash{
      HostClash::Level::kError, HostClash::Check::kThp,
      absl::StrCat("TPUSHIM_HUGEPAGES=thp but transparent huge pages are "
                   "disabled (",
                   kThpDir,
                   "/enabled is \"never\"); enable them with `echo madvise | "
                   "sudo tee ",
                   kThpDir, "/enabled` or set TPUSHIM_HUGEPAGES=auto.")};
}

std::optional<HostClash> CheckNumaNode(const Options& options,
                                       const HostFacts& facts) {
  if (!options.numa_node.value.has_value()) return std::nullopt;
  const int wanted = *options.numa_node.value;
  std::vector<int> nodes;
  for (const HostFacts::NumaNode& n : facts.numa_nodes) {
    if (n.node == wanted) return std::nullopt;
    nodes.push_back(n.node);
  }
  return HostClash{
      HostClash::Level::kError, HostClash::Check::kNumaNode,
      absl::StrCat("TPUSHIM_NUMA_NODE=", wanted,
                   " names a NUMA node this host does not have (it has ",
                   nodes.empty() ? std::string("no readable node")
                   : nodes.size() == 1
                       ? absl::StrCat("only node ", nodes[0])
                       : absl::StrCat("nodes ", absl::StrJoin(nodes, ", ")),
                   "); set TPUSHIM_NUMA_NODE to an existing node or to auto.")};
}

}  // namespace

uint64_t HostFacts::UsableMemoryBytes() const {
  return std::min(mem_available_bytes,
                  cgroup_memory_headroom_bytes.value_or(mem_available_bytes));
}

bool HostFacts::CanLock(uint64_t bytes) const {
  return has_cap_ipc_lock || memlock.soft >= bytes;
}

std::optional<HostFacts::HugePagePool> HostFacts::PoolFor(
    uint64_t bytes) const {
  std::optional<HugePagePool> best;
  for (const HugePagePool& pool : hugepage_pools) {
    if (pool.page_bytes == 0 || UnclaimedPages(pool) < PagesFor(bytes, pool)) {
      continue;
    }
    if (!best.has_value() || pool.page_bytes == kDefaultHugePageBytes) {
      best = pool;
    }
  }
  return best;
}

uint64_t MemoryHeadroomBytes(uint64_t usable_bytes) {
  return (uint64_t{64} << 20) + usable_bytes / 50;
}

absl::Status HostClash::ToStatus() const {
  switch (check) {
    case Check::kMemory:
    case Check::kMemlock:
    case Check::kHugetlb:
      return absl::ResourceExhaustedError(message);
    case Check::kThp:
      return absl::FailedPreconditionError(message);
    case Check::kLogDirectory:
    case Check::kVfioDevice:
      return absl::FailedPreconditionError(message);
    case Check::kVfioDeviceMissing:
      return absl::NotFoundError(message);
    case Check::kNumaNode:
      return absl::InvalidArgumentError(message);
  }
  return absl::InternalError(message);
}

absl::StatusOr<HostFacts> ReadHostFacts(Os& os) {
  HostFacts facts;
  TPUSHIM_RETURN_IF_ERROR(ReadMeminfo(os, facts));
  ReadCgroup(os, facts);
  // A failed getrlimit leaves the limit at 0: nothing can be locked.
  facts.memlock = os.GetMemlockLimit().value_or(ResourceLimit{});
  facts.has_cap_ipc_lock = os.HasIpcLockCapability();
  ReadHugePages(os, facts);
  ReadNuma(os, facts);
  facts.online_cpus = os.OnlineCpuCount();
  facts.page_size = os.PageSize();
  return facts;
}

std::string MemlockRaiseAdvice(const ResourceLimit& memlock, uint64_t need) {
  // `ulimit -l` takes KiB; an unprivileged shell may raise the soft limit
  // up to the hard one.
  const std::string shell_fix =
      memlock.hard >= need
          ? absl::StrCat("`ulimit -l ",
                         need / 1024 + (need % 1024 != 0 ? 1 : 0), "`")
          : absl::StrCat("`ulimit -l unlimited` (as root; the hard limit is ",
                         BytesWithHumanReadable(memlock.hard), ")");
  return absl::StrCat(
      "raise the limit with ", shell_fix,
      ", a `memlock` line in /etc/security/limits.conf, docker "
      "`--ulimit memlock=-1` or systemd `LimitMEMLOCK=infinity`");
}

std::vector<HostClash> CheckOptionsAgainstHost(const Options& options,
                                               const HostFacts& facts) {
  std::vector<std::optional<HostClash>> candidates;
  if (options.premapped_region_enabled()) {
    candidates.push_back(CheckMemory(options, facts));
    candidates.push_back(CheckMemlock(options, facts));
    candidates.push_back(CheckHugetlb(options, facts));
    candidates.push_back(CheckThp(options, facts));
  }
  candidates.push_back(CheckNumaNode(options, facts));
  std::vector<HostClash> clashes;
  for (std::optional<HostClash>& c : candidates) {
    if (c.has_value()) clashes.push_back(*std::move(c));
  }
  return clashes;
}

}  // namespace tpushim
