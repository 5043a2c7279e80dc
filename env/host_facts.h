// Host facts that decide whether the premapped region can be mapped and
// pinned: memory available to this process (host and cgroup), the memlock
// limit and CAP_IPC_LOCK, transparent and reserved huge pages, NUMA nodes
// and CPUs. Read through the Os layer, so tests fake any of them.
//
// Used by `tpushim info` and by the premapped region's pre-checks.
//
//   TPUSHIM_ASSIGN_OR_RETURN(HostFacts facts, ReadHostFacts(*os));
//   for (const HostClash& c : CheckOptionsAgainstHost(options, facts)) ...
//
// Thread-safety: pure functions of what the Os returns.

#ifndef TPUSHIM_ENV_HOST_FACTS_H_
#define TPUSHIM_ENV_HOST_FACTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "env/options.h"
#include "env/os.h"

namespace tpushim {

struct HostFacts {
  // /proc/meminfo.
  uint64_t mem_total_bytes = 0;
  uint64_t mem_available_bytes = 0;

  // The tightest memory limit of this process's cgroup and its ancestors
  // (v2 memory.max, v1 memory.limit_in_bytes); nullopt when unlimited or
  // when there is no memory controller. `cgroup_version` is 0 then.
  int cgroup_version = 0;
  std::string cgroup_path;  // e.g. "/user.slice/session-1.scope"
  std::optional<uint64_t> cgroup_memory_limit_bytes;
  // Usage of this process's own cgroup (v2 memory.current, v1
  // memory.usage_in_bytes); nullopt when unreadable.
  std::optional<uint64_t> cgroup_memory_usage_bytes;
  // What the cgroups let this process still fault in: the smallest
  // (limit - working set) over its cgroup and the ancestors that have a
  // limit, where the working set is the usage minus the inactive file cache
  // (which the kernel reclaims before it OOM-kills). It sees siblings' use
  // of a shared ancestor's limit, which the leaf usage alone does not.
  // nullopt when no level has a limit.
  std::optional<uint64_t> cgroup_memory_headroom_bytes;

  // RLIMIT_MEMLOCK and CAP_IPC_LOCK (which lifts it).
  ResourceLimit memlock;
  bool has_cap_ipc_lock = false;

  // /sys/kernel/mm/transparent_hugepage/{enabled,defrag}: the bracketed
  // word ("always", "madvise", "never"); "" when the kernel has no THP.
  std::string thp_enabled;
  std::string thp_defrag;

  // /sys/kernel/mm/hugepages/hugepages-<kB>kB, one per page size.
  struct HugePagePool {
    uint64_t page_bytes = 0;
    uint64_t total_pages = 0;     // nr_hugepages
    uint64_t free_pages = 0;      // free_hugepages
    uint64_t reserved_pages = 0;  // resv_hugepages
  };
  std::vector<HugePagePool> hugepage_pools;

  struct NumaNode {
    int node = 0;
    uint64_t total_bytes = 0;
    uint64_t free_bytes = 0;
  };
  std::vector<NumaNode> numa_nodes;

  int online_cpus = 1;
  uint64_t page_size = 4096;
  // Other tpushim processes of the host (holders of chip locks in the run
  // directory, env/chips.h): what they have yet to pin of what they said
  // they would (their region or bounce pool minus their VmLck), which
  // MemAvailable does not show yet, and a description of each ("pid 12
  // pins 4.00G of 4.00G"). Filled by AddOtherTpushimProcesses, not by
  // ReadHostFacts.
  uint64_t other_tpushim_pending_bytes = 0;
  std::vector<std::string> other_tpushim;

  // What this process can still fault in before the host or its cgroup
  // refuses: MemAvailable, lowered to the cgroup headroom when that is
  // smaller.
  uint64_t UsableMemoryBytes() const;
  // True when `bytes` can be locked: CAP_IPC_LOCK, or a soft memlock limit
  // of at least `bytes`.
  bool CanLock(uint64_t bytes) const;
  // The hugetlb pool whose free, unreserved pages can hold `bytes`,
  // preferring 2 MiB pages; nullopt when none can.
  std::optional<HugePagePool> PoolFor(uint64_t bytes) const;
};

// Reads the facts. Only an unreadable /proc/meminfo is an error (INTERNAL
// naming the file); every other missing source (no cgroup, no THP, no
// hugepages directory, no NUMA) leaves its fields at their "absent" values.
absl::StatusOr<HostFacts> ReadHostFacts(Os& os);

// Where the configuration and the host disagree.
struct HostClash {
  enum class Level { kWarning, kError };
  enum class Check {
    kMemory,
    kMemlock,
    kHugetlb,
    kThp,
    kNumaNode,
    kLogDirectory,
    kVfioDevice,        // the vfio:// function cannot be opened as it is
    kVfioDeviceMissing  // no such PCI function
  };
  Level level = Level::kWarning;
  Check check = Check::kMemory;
  std::string message;  // one sentence, says what to change

  // The error start-up returns for this clash: RESOURCE_EXHAUSTED for
  // memory, memlock and hugetlb pages, FAILED_PRECONDITION for THP, the log
  // directory and a vfio:// function that cannot be opened, NOT_FOUND for a
  // vfio:// function that does not exist, INVALID_ARGUMENT for the NUMA node.
  absl::Status ToStatus() const;
};

// Memory start-up leaves to everything else when it checks the region
// against what the host can give: 64 MiB plus 2 % of the usable memory.
uint64_t MemoryHeadroomBytes(uint64_t usable_bytes);

// The clashes, in this order; empty when the configuration fits:
//  * the region plus MemoryHeadroomBytes() is larger than
//    UsableMemoryBytes() less what other tpushim processes have yet to pin
//    (kError: start-up would fail with RESOURCE_EXHAUSTED naming
//    MemAvailable, the cgroup limit and those processes). Not checked
//    when the region comes from hugetlb pools, which neither MemAvailable nor
//    the memory cgroup count: under TPUSHIM_HUGEPAGES=hugetlb, or =auto when a
//    pool holds it;
//  * CanLock(region) is false (kWarning: the region stays unpinned; kError
//    under TPUSHIM_MLOCK=required). Not checked under TPUSHIM_MLOCK=off;
//  * TPUSHIM_HUGEPAGES=hugetlb and no pool has enough free, unreserved pages
//    for the region (kError);
//  * TPUSHIM_HUGEPAGES=thp and THP is "never" or absent (kError);
//  * TPUSHIM_NUMA_NODE names a node the host does not have (kError).
// Only the NUMA check applies when the region is off (size 0).
std::vector<HostClash> CheckOptionsAgainstHost(const Options& options,
                                               const HostFacts& facts);

// How to raise RLIMIT_MEMLOCK so that `need` bytes can be locked, in the
// words start-up uses for the region: "raise the limit with `ulimit -l
// N`, a `memlock` line in /etc/security/limits.conf, docker `--ulimit
// memlock=-1` or systemd `LimitMEMLOCK=infinity`" (`ulimit -l unlimited`
// as root when the hard limit is below `need`).
std::string MemlockRaiseAdvice(const ResourceLimit& memlock, uint64_t need);

}  // namespace tpushim

#endif  // TPUSHIM_ENV_HOST_FACTS_H_
