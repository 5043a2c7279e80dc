// Tests of ReadHostFacts over a fake /proc and /sys, of the derived
// quantities, and of CheckOptionsAgainstHost.

#include "env/host_facts.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/human_bytes.h"
#include "env/options.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB << 10;
constexpr uint64_t kGiB = kMiB << 10;

constexpr char kMeminfo[] =
    "MemTotal:       16777216 kB\n"
    "MemFree:         1048576 kB\n"
    "MemAvailable:   12582912 kB\n"
    "Buffers:          123456 kB\n"
    "HugePages_Total:       0\n"
    "Hugepagesize:       2048 kB\n";

// An Os whose files, limits and NUMA layout are canned. Files live in a
// path -> contents map; a path is a directory when some file lies below it.
// Everything not overridden is the real Os.
class FakeHostOs : public OsWrapper {
 public:
  FakeHostOs() : OsWrapper(Os::Default()) {
    files_["/proc/meminfo"] = kMeminfo;
  }

  void SetFile(const std::string& path, const std::string& contents) {
    files_[path] = contents;
  }
  void RemoveFile(const std::string& path) { files_.erase(path); }
  void set_memlock(ResourceLimit limit) { memlock_ = limit; }
  void set_cap_ipc_lock(bool has) { cap_ipc_lock_ = has; }
  // Node i gets numa_memory[i]; nullopt makes NumaMemoryOfNode(i) fail.
  void set_numa(std::vector<std::optional<NumaNodeMemory>> nodes) {
    numa_ = std::move(nodes);
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    auto it = files_.find(path);
    if (it == files_.end()) {
      return absl::NotFoundError(absl::StrCat("open(", path, ")"));
    }
    return it->second;
  }

  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    FileInfo info;
    if (files_.contains(path)) {
      info.type = FileInfo::Type::kRegular;
      return info;
    }
    if (!Children(path).empty()) {
      info.type = FileInfo::Type::kDirectory;
      return info;
    }
    return absl::NotFoundError(absl::StrCat("stat(", path, ")"));
  }

  absl::StatusOr<std::vector<std::string>> ListDirectory(
      const std::string& path) override {
    std::set<std::string> children = Children(path);
    if (children.empty()) {
      return absl::NotFoundError(absl::StrCat("opendir(", path, ")"));
    }
    return std::vector<std::string>(children.begin(), children.end());
  }

  absl::StatusOr<ResourceLimit> GetMemlockLimit() override { return memlock_; }
  bool HasIpcLockCapability() override { return cap_ipc_lock_; }
  int NumaNodeCount() override { return static_cast<int>(numa_.size()); }
  absl::StatusOr<NumaNodeMemory> NumaMemoryOfNode(int node) override {
    if (node < 0 || node >= NumaNodeCount() || !numa_[node].has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NUMA node ", node, " does not exist"));
    }
    return *numa_[node];
  }
  int OnlineCpuCount() override { return 8; }
  size_t PageSize() override { return 4096; }

 private:
  std::set<std::string> Children(const std::string& path) const {
    const std::string prefix = absl::StrCat(path, "/");
    std::set<std::string> children;
    for (auto it = files_.lower_bound(prefix);
         it != files_.end() && absl::StartsWith(it->first, prefix); ++it) {
      const std::string rest = it->first.substr(prefix.size());
      children.insert(rest.substr(0, rest.find('/')));
    }
    return children;
  }

  std::map<std::string, std::string> files_;
  ResourceLimit memlock_{8 * kMiB, 8 * kMiB};
  bool cap_ipc_lock_ = false;
  std::vector<std::optional<NumaNodeMemory>> numa_{
      NumaNodeMemory{16 * kGiB, 10 * kGiB}};
};

HostFacts ReadOrDie(FakeHostOs& os) {
  absl::StatusOr<HostFacts> facts = ReadHostFacts(os);
  EXPECT_TRUE(facts.ok()) << facts.status();
  return facts.ok() ? *facts : HostFacts{};
}

// ---- /proc/meminfo ---------------------------------------------------------

TEST(ReadHostFactsTest, ReadsMeminfoInBytes) {
  FakeHostOs os;
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.mem_total_bytes, 16 * kGiB);
  EXPECT_EQ(facts.mem_available_bytes, 12 * kGiB);
}

TEST(ReadHostFactsTest, UnreadableMeminfoIsInternalNamingTheFile) {
  FakeHostOs os;
  os.RemoveFile("/proc/meminfo");
  absl::StatusOr<HostFacts> facts = ReadHostFacts(os);
  ASSERT_FALSE(facts.ok());
  EXPECT_EQ(facts.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(facts.status().message()),
              HasSubstr("/proc/meminfo"));
}

TEST(ReadHostFactsTest, MeminfoWithoutMemAvailableIsInternalNamingTheFile) {
  FakeHostOs os;
  os.SetFile("/proc/meminfo",
             "MemTotal:       16777216 kB\nMemFree:  1048576 kB\n");
  absl::StatusOr<HostFacts> facts = ReadHostFacts(os);
  ASSERT_FALSE(facts.ok());
  EXPECT_EQ(facts.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(facts.status().message()),
              AllOf(HasSubstr("/proc/meminfo"), HasSubstr("MemAvailable")));
}

TEST(ReadHostFactsTest, MalformedMemAvailableIsInternal) {
  FakeHostOs os;
  os.SetFile("/proc/meminfo",
             "MemTotal:       16777216 kB\nMemAvailable:   lots kB\n");
  absl::StatusOr<HostFacts> facts = ReadHostFacts(os);
  ASSERT_FALSE(facts.ok());
  EXPECT_EQ(facts.status().code(), absl::StatusCode::kInternal);
}

// ---- cgroups ---------------------------------------------------------------

TEST(ReadHostFactsTest, NoCgroupFileMeansNoCgroup) {
  FakeHostOs os;
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_version, 0);
  EXPECT_EQ(facts.cgroup_path, "");
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, std::nullopt);
  EXPECT_EQ(facts.cgroup_memory_usage_bytes, std::nullopt);
  EXPECT_EQ(facts.cgroup_memory_headroom_bytes, std::nullopt);
}

TEST(ReadHostFactsTest, CgroupV2NestedLimitsTightestWins) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "0::/outer/middle/leaf\n");
  os.SetFile("/sys/fs/cgroup/cgroup.controllers",
             "cpuset cpu io memory pids\n");
  os.SetFile("/sys/fs/cgroup/outer/memory.max", "8589934592\n");
  os.SetFile("/sys/fs/cgroup/outer/middle/memory.max", "2147483648\n");
  os.SetFile("/sys/fs/cgroup/outer/middle/leaf/memory.max", "max\n");
  os.SetFile("/sys/fs/cgroup/outer/middle/leaf/memory.current", "104857600\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_version, 2);
  EXPECT_EQ(facts.cgroup_path, "/outer/middle/leaf");
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, 2 * kGiB);
  EXPECT_EQ(facts.cgroup_memory_usage_bytes, 100 * kMiB);
  // Ancestors' usage unreadable: the leaf's stands in.
  EXPECT_EQ(facts.cgroup_memory_headroom_bytes, 2 * kGiB - 100 * kMiB);
}

TEST(ReadHostFactsTest, CgroupV2HeadroomCountsSiblingsUnderASharedLimit) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "0::/pod/container\n");
  os.SetFile("/sys/fs/cgroup/cgroup.controllers", "memory\n");
  os.SetFile("/sys/fs/cgroup/pod/memory.max", "4294967296\n");
  os.SetFile("/sys/fs/cgroup/pod/memory.current", "3221225472\n");
  os.SetFile("/sys/fs/cgroup/pod/memory.stat",
             "anon 1\nfile 2\ninactive_file 536870912\nactive_file 3\n");
  os.SetFile("/sys/fs/cgroup/pod/container/memory.max", "3221225472\n");
  os.SetFile("/sys/fs/cgroup/pod/container/memory.current", "1073741824\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, 3 * kGiB);
  EXPECT_EQ(facts.cgroup_memory_usage_bytes, 1 * kGiB);
  // Leaf: 3G - 1G = 2G. Pod: 4G - (3G - 512M inactive file) = 1.5G.
  EXPECT_EQ(facts.cgroup_memory_headroom_bytes, 1536 * kMiB);
  EXPECT_EQ(facts.UsableMemoryBytes(), 1536 * kMiB);
}

TEST(ReadHostFactsTest, CgroupV2AllMaxIsUnlimited) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  os.SetFile("/sys/fs/cgroup/cgroup.controllers", "memory\n");
  os.SetFile("/sys/fs/cgroup/user.slice/memory.max", "max\n");
  os.SetFile("/sys/fs/cgroup/user.slice/session-1.scope/memory.max", "max\n");
  os.SetFile("/sys/fs/cgroup/user.slice/session-1.scope/memory.current",
             "4096\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_version, 2);
  EXPECT_EQ(facts.cgroup_path, "/user.slice/session-1.scope");
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, std::nullopt);
  EXPECT_EQ(facts.cgroup_memory_usage_bytes, 4096u);
  EXPECT_EQ(facts.cgroup_memory_headroom_bytes, std::nullopt);
}

TEST(ReadHostFactsTest, CgroupV2WithoutMemoryControllerIsNoCgroup) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "0::/a\n");
  os.SetFile("/sys/fs/cgroup/cgroup.controllers", "cpu io pids\n");
  os.SetFile("/sys/fs/cgroup/a/cgroup.procs", "1\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_version, 0);
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, std::nullopt);
}

TEST(ReadHostFactsTest, CgroupV2PathMissingInContainerFallsBackToRoot) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "0::/kubepods/burstable/pod1/abc\n");
  os.SetFile("/sys/fs/cgroup/cgroup.controllers", "memory\n");
  os.SetFile("/sys/fs/cgroup/memory.max", "536870912\n");
  os.SetFile("/sys/fs/cgroup/memory.current", "134217728\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_version, 2);
  EXPECT_EQ(facts.cgroup_path, "/kubepods/burstable/pod1/abc");
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, 512 * kMiB);
  EXPECT_EQ(facts.cgroup_memory_usage_bytes, 128 * kMiB);
  EXPECT_EQ(facts.cgroup_memory_headroom_bytes, 384 * kMiB);
}

TEST(ReadHostFactsTest, CgroupPathOutsideTheNamespaceFallsBackToRoot) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "0::/../sibling\n");
  os.SetFile("/sys/fs/cgroup/cgroup.controllers", "memory\n");
  os.SetFile("/sys/fs/cgroup/memory.max", "1073741824\n");
  os.SetFile("/sys/fs/cgroup/sibling/memory.max", "4096\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, 1 * kGiB);
}

TEST(ReadHostFactsTest, CgroupV1WithCommaSeparatedControllers) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup",
             "12:cpu,cpuacct:/docker/abc\n"
             "11:name=systemd:/docker/abc\n"
             "7:blkio,memory:/docker/abc\n"
             "0::/\n");
  os.SetFile("/sys/fs/cgroup/memory/memory.limit_in_bytes",
             "9223372036854771712\n");
  os.SetFile("/sys/fs/cgroup/memory/docker/memory.limit_in_bytes",
             "6442450944\n");
  os.SetFile("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
             "17179869184\n");
  os.SetFile("/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes",
             "1073741824\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_version, 1);
  EXPECT_EQ(facts.cgroup_path, "/docker/abc");
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, 6 * kGiB);
  EXPECT_EQ(facts.cgroup_memory_usage_bytes, 1 * kGiB);
  EXPECT_EQ(facts.cgroup_memory_headroom_bytes, 5 * kGiB);
}

TEST(ReadHostFactsTest, CgroupV1ValuesFrom2To62AreUnlimited) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "4:memory:/batch\n");
  os.SetFile("/sys/fs/cgroup/memory/memory.limit_in_bytes",
             "9223372036854771712\n");
  os.SetFile("/sys/fs/cgroup/memory/batch/memory.limit_in_bytes",
             absl::StrCat(uint64_t{1} << 62, "\n"));
  os.SetFile("/sys/fs/cgroup/memory/batch/memory.usage_in_bytes", "77692928\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_version, 1);
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, std::nullopt);
  EXPECT_EQ(facts.cgroup_memory_usage_bytes, 77692928u);
  EXPECT_EQ(facts.cgroup_memory_headroom_bytes, std::nullopt);
}

TEST(ReadHostFactsTest, CgroupV1JustBelow2To62IsALimit) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "4:memory:/\n");
  os.SetFile("/sys/fs/cgroup/memory/memory.limit_in_bytes",
             absl::StrCat((uint64_t{1} << 62) - 4096, "\n"));
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, (uint64_t{1} << 62) - 4096);
}

TEST(ReadHostFactsTest, CgroupV1MemoryWinsOverTheUnifiedHierarchy) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "0::/\n4:memory:/job\n");
  os.SetFile("/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "1073741824\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_version, 1);
  EXPECT_EQ(facts.cgroup_path, "/job");
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, 1 * kGiB);
}

TEST(ReadHostFactsTest, CgroupV1PathMissingInContainerFallsBackToRoot) {
  FakeHostOs os;
  os.SetFile("/proc/self/cgroup", "9:memory:/docker/0123abcd\n");
  os.SetFile("/sys/fs/cgroup/memory/memory.limit_in_bytes", "2147483648\n");
  os.SetFile("/sys/fs/cgroup/memory/memory.usage_in_bytes", "1073741824\n");
  os.SetFile("/sys/fs/cgroup/memory/memory.stat",
             "cache 10\ntotal_inactive_file 268435456\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.cgroup_version, 1);
  EXPECT_EQ(facts.cgroup_path, "/docker/0123abcd");
  EXPECT_EQ(facts.cgroup_memory_limit_bytes, 2 * kGiB);
  EXPECT_EQ(facts.cgroup_memory_usage_bytes, 1 * kGiB);
  EXPECT_EQ(facts.cgroup_memory_headroom_bytes, 2 * kGiB - 768 * kMiB);
}

// ---- Huge pages, limits, NUMA, CPUs ----------------------------------------

TEST(ReadHostFactsTest, ReadsTheBracketedThpWords) {
  FakeHostOs os;
  os.SetFile("/sys/kernel/mm/transparent_hugepage/enabled",
             "always [madvise] never\n");
  os.SetFile("/sys/kernel/mm/transparent_hugepage/defrag",
             "always defer defer+madvise [madvise] never\n");
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.thp_enabled, "madvise");
  EXPECT_EQ(facts.thp_defrag, "madvise");

  os.SetFile("/sys/kernel/mm/transparent_hugepage/enabled",
             "always madvise [never]\n");
  os.SetFile("/sys/kernel/mm/transparent_hugepage/defrag",
             "[always] defer defer+madvise madvise never\n");
  facts = ReadOrDie(os);
  EXPECT_EQ(facts.thp_enabled, "never");
  EXPECT_EQ(facts.thp_defrag, "always");
}

TEST(ReadHostFactsTest, NoThpIsEmptyWords) {
  FakeHostOs os;
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.thp_enabled, "");
  EXPECT_EQ(facts.thp_defrag, "");
}

TEST(ReadHostFactsTest, ReadsHugePagePoolsSortedBySize) {
  FakeHostOs os;
  const std::string dir = "/sys/kernel/mm/hugepages/";
  os.SetFile(dir + "hugepages-1048576kB/nr_hugepages", "4\n");
  os.SetFile(dir + "hugepages-1048576kB/free_hugepages", "3\n");
  os.SetFile(dir + "hugepages-1048576kB/resv_hugepages", "1\n");
  os.SetFile(dir + "hugepages-2048kB/nr_hugepages", "1024\n");
  os.SetFile(dir + "hugepages-2048kB/free_hugepages", "1000\n");
  os.SetFile(dir + "hugepages-2048kB/resv_hugepages", "0\n");
  os.SetFile(dir + "README/nr_hugepages", "7\n");
  os.SetFile(dir + "hugepages-64kB/nr_hugepages", "7\n");  // incomplete
  HostFacts facts = ReadOrDie(os);
  ASSERT_THAT(facts.hugepage_pools, SizeIs(2));
  EXPECT_EQ(facts.hugepage_pools[0].page_bytes, 2 * kMiB);
  EXPECT_EQ(facts.hugepage_pools[0].total_pages, 1024u);
  EXPECT_EQ(facts.hugepage_pools[0].free_pages, 1000u);
  EXPECT_EQ(facts.hugepage_pools[0].reserved_pages, 0u);
  EXPECT_EQ(facts.hugepage_pools[1].page_bytes, 1 * kGiB);
  EXPECT_EQ(facts.hugepage_pools[1].total_pages, 4u);
  EXPECT_EQ(facts.hugepage_pools[1].free_pages, 3u);
  EXPECT_EQ(facts.hugepage_pools[1].reserved_pages, 1u);
}

TEST(ReadHostFactsTest, NoHugepagesDirectoryIsNoPools) {
  FakeHostOs os;
  EXPECT_THAT(ReadOrDie(os).hugepage_pools, IsEmpty());
}

TEST(ReadHostFactsTest, ReadsLimitsCapabilityCpusAndPageSize) {
  FakeHostOs os;
  os.set_memlock({64 * kKiB, ResourceLimit::kUnlimited});
  os.set_cap_ipc_lock(true);
  HostFacts facts = ReadOrDie(os);
  EXPECT_EQ(facts.memlock.soft, 64 * kKiB);
  EXPECT_EQ(facts.memlock.hard, ResourceLimit::kUnlimited);
  EXPECT_TRUE(facts.has_cap_ipc_lock);
  EXPECT_EQ(facts.online_cpus, 8);
  EXPECT_EQ(facts.page_size, 4096u);
}

TEST(ReadHostFactsTest, ReadsEveryReadableNumaNode) {
  FakeHostOs os;
  os.set_numa({Os::NumaNodeMemory{32 * kGiB, 30 * kGiB}, std::nullopt,
               Os::NumaNodeMemory{16 * kGiB, 1 * kGiB}});
  HostFacts facts = ReadOrDie(os);
  ASSERT_THAT(facts.numa_nodes, SizeIs(2));
  EXPECT_EQ(facts.numa_nodes[0].node, 0);
  EXPECT_EQ(facts.numa_nodes[0].total_bytes, 32 * kGiB);
  EXPECT_EQ(facts.numa_nodes[0].free_bytes, 30 * kGiB);
  EXPECT_EQ(facts.numa_nodes[1].node, 2);
  EXPECT_EQ(facts.numa_nodes[1].total_bytes, 16 * kGiB);
  EXPECT_EQ(facts.numa_nodes[1].free_bytes, 1 * kGiB);
}

TEST(ReadHostFactsTest, RealHostSatisfiesInvariants) {
  absl::StatusOr<HostFacts> facts = ReadHostFacts(*Os::Default());
  ASSERT_TRUE(facts.ok()) << facts.status();
  EXPECT_GT(facts->mem_total_bytes, 0u);
  EXPECT_GT(facts->mem_available_bytes, 0u);
  EXPECT_LE(facts->mem_available_bytes, facts->mem_total_bytes);
  EXPECT_GE(facts->online_cpus, 1);
  EXPECT_GE(facts->numa_nodes.size(), 1u);
  EXPECT_GT(facts->page_size, 0u);
  EXPECT_LE(facts->UsableMemoryBytes(), facts->mem_available_bytes);
  EXPECT_GE(facts->cgroup_version, 0);
  EXPECT_LE(facts->cgroup_version, 2);
}

// ---- UsableMemoryBytes, CanLock --------------------------------------------

TEST(HostFactsTest, UsableMemoryIsTheCgroupHeadroomWhenTighter) {
  HostFacts facts;
  facts.mem_available_bytes = 10 * kGiB;
  facts.cgroup_memory_headroom_bytes = 3 * kGiB;
  EXPECT_EQ(facts.UsableMemoryBytes(), 3 * kGiB);
}

TEST(HostFactsTest, UsableMemoryIsMemAvailableWhenTighter) {
  HostFacts facts;
  facts.mem_available_bytes = 2 * kGiB;
  facts.cgroup_memory_headroom_bytes = 3 * kGiB;
  EXPECT_EQ(facts.UsableMemoryBytes(), 2 * kGiB);
}

TEST(HostFactsTest, UsableMemoryIsMemAvailableWithoutCgroupLimit) {
  HostFacts facts;
  facts.mem_available_bytes = 2 * kGiB;
  EXPECT_EQ(facts.UsableMemoryBytes(), 2 * kGiB);
}

TEST(HostFactsTest, CanLockWithCapabilityOrASoftLimitAtLeastTheSize) {
  HostFacts facts;
  facts.memlock = {8 * kMiB, 8 * kMiB};
  EXPECT_TRUE(facts.CanLock(8 * kMiB));
  EXPECT_FALSE(facts.CanLock(8 * kMiB + 1));
  facts.has_cap_ipc_lock = true;
  EXPECT_TRUE(facts.CanLock(1 * kGiB));
  facts.has_cap_ipc_lock = false;
  facts.memlock.soft = ResourceLimit::kUnlimited;
  EXPECT_TRUE(facts.CanLock(~uint64_t{0}));
}

TEST(HostFactsTest, BytesWithHumanReadableShowsBothForms) {
  EXPECT_EQ(BytesWithHumanReadable(4 * kGiB), "4294967296 (4.00G)");
  EXPECT_EQ(BytesWithHumanReadable(123), "123 (123B)");
}

// ---- CheckOptionsAgainstHost -----------------------------------------------

// A host on which the default configuration fits.
HostFacts RoomyHost() {
  HostFacts facts;
  facts.mem_total_bytes = 64 * kGiB;
  facts.mem_available_bytes = 60 * kGiB;
  facts.memlock = {ResourceLimit::kUnlimited, ResourceLimit::kUnlimited};
  facts.thp_enabled = "madvise";
  facts.thp_defrag = "madvise";
  facts.hugepage_pools = {{2 * kMiB, 0, 0, 0}, {1 * kGiB, 0, 0, 0}};
  facts.numa_nodes = {{0, 32 * kGiB, 30 * kGiB}, {1, 32 * kGiB, 30 * kGiB}};
  facts.online_cpus = 16;
  return facts;
}

Options WithRegion(uint64_t size) {
  Options options;
  options.premapped_buffer_size.value = size;
  options.premapped_buffer_transfer_threshold_bytes.value = size;
  return options;
}

auto IsClash(HostClash::Level level, const auto& message_matcher) {
  return AllOf(Field(&HostClash::level, level),
               Field(&HostClash::message, message_matcher));
}

TEST(CheckOptionsAgainstHostTest, DefaultsFitARoomyHost) {
  // Named: GCC 12 warns (maybe-uninitialized) destroying a temporary.
  const Options defaults;
  EXPECT_THAT(CheckOptionsAgainstHost(defaults, RoomyHost()), IsEmpty());
}

TEST(CheckOptionsAgainstHostTest, RegionLargerThanMemAvailableIsAnError) {
  HostFacts facts = RoomyHost();
  facts.mem_available_bytes = 3 * kGiB;
  const std::vector<HostClash> clashes =
      CheckOptionsAgainstHost(WithRegion(4 * kGiB), facts);
  EXPECT_THAT(
      clashes,
      ElementsAre(IsClash(
          HostClash::Level::kError,
          AllOf(HasSubstr("Cannot premap TPU_PREMAPPED_BUFFER_SIZE=4294967296 "
                          "(4.00G)"),
                HasSubstr("MemAvailable is 3221225472 (3.00G)"),
                HasSubstr("there is no cgroup memory limit")))));
  ASSERT_EQ(clashes.size(), 1u);
  EXPECT_EQ(clashes[0].check, HostClash::Check::kMemory);
  EXPECT_EQ(clashes[0].ToStatus().code(), absl::StatusCode::kResourceExhausted);
}

TEST(CheckOptionsAgainstHostTest, RegionLargerThanCgroupHeadroomIsAnError) {
  HostFacts facts = RoomyHost();
  facts.cgroup_version = 2;
  facts.cgroup_memory_limit_bytes = 4 * kGiB;
  facts.cgroup_memory_usage_bytes = 1 * kGiB;
  facts.cgroup_memory_headroom_bytes = 3 * kGiB;
  const uint64_t most =
      (3 * kGiB - MemoryHeadroomBytes(3 * kGiB)) / 4096 * 4096;
  EXPECT_THAT(
      CheckOptionsAgainstHost(WithRegion(4 * kGiB), facts),
      ElementsAre(IsClash(
          HostClash::Level::kError,
          AllOf(HasSubstr("the cgroup memory limit is 4294967296 (4.00G) with "
                          "1073741824 (1.00G) in use"),
                HasSubstr(absl::StrCat("at most ", most, " "))))));
}

TEST(CheckOptionsAgainstHostTest, RegionThatFitsWithHeadroomIsNoClash) {
  HostFacts facts = RoomyHost();
  facts.mem_available_bytes = 4 * kGiB + MemoryHeadroomBytes(5 * kGiB);
  EXPECT_THAT(CheckOptionsAgainstHost(WithRegion(4 * kGiB), facts), IsEmpty());
}

TEST(CheckOptionsAgainstHostTest, RegionThatLeavesNoHeadroomIsAnError) {
  HostFacts facts = RoomyHost();
  facts.mem_available_bytes = 4 * kGiB + 4096;  // fits, but leaves nothing
  EXPECT_THAT(CheckOptionsAgainstHost(WithRegion(4 * kGiB), facts),
              ElementsAre(IsClash(HostClash::Level::kError,
                                  HasSubstr("must stay free"))));
}

TEST(CheckOptionsAgainstHostTest,
     HugetlbRegionIsNotCheckedAgainstMemAvailable) {
  HostFacts facts = RoomyHost();
  facts.mem_available_bytes = 1 * kGiB;  // the pool is not counted in it
  facts.hugepage_pools = {{2 * kMiB, 2048, 2048, 0}};
  Options options = WithRegion(4 * kGiB);
  options.hugepages.value = HugePagesMode::kHugetlb;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts), IsEmpty());
  options.hugepages.value = HugePagesMode::kAuto;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts), IsEmpty());
  options.hugepages.value = HugePagesMode::kThp;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts),
              ElementsAre(IsClash(HostClash::Level::kError,
                                  HasSubstr("Cannot premap"))));
}

TEST(CheckOptionsAgainstHostTest, EachClashMapsToItsStatusCode) {
  const std::pair<HostClash::Check, absl::StatusCode> kCases[] = {
      {HostClash::Check::kMemory, absl::StatusCode::kResourceExhausted},
      {HostClash::Check::kMemlock, absl::StatusCode::kResourceExhausted},
      {HostClash::Check::kHugetlb, absl::StatusCode::kResourceExhausted},
      {HostClash::Check::kThp, absl::StatusCode::kFailedPrecondition},
      {HostClash::Check::kNumaNode, absl::StatusCode::kInvalidArgument},
      {HostClash::Check::kLogDirectory, absl::StatusCode::kFailedPrecondition},
      {HostClash::Check::kVfioDevice, absl::StatusCode::kFailedPrecondition},
      {HostClash::Check::kVfioDeviceMissing, absl::StatusCode::kNotFound},
  };
  for (const auto& [check, code] : kCases) {
    HostClash clash{HostClash::Level::kError, check, "why"};
    EXPECT_EQ(clash.ToStatus().code(), code);
    EXPECT_EQ(clash.ToStatus().message(), "why");
  }
}

TEST(HostFactsTest, PoolForPrefersTwoMegabytePages) {
  HostFacts facts;
  facts.hugepage_pools = {{kGiB, 8, 8, 0}, {2 * kMiB, 4096, 4096, 0}};
  ASSERT_TRUE(facts.PoolFor(kGiB).has_value());
  EXPECT_EQ(facts.PoolFor(kGiB)->page_bytes, 2 * kMiB);
  // Reserved pages are not available.
  facts.hugepage_pools = {{2 * kMiB, 512, 512, 100}};
  EXPECT_FALSE(facts.PoolFor(kGiB).has_value());
  EXPECT_TRUE(facts.PoolFor(kGiB - 200 * kMiB).has_value());
}

TEST(CheckOptionsAgainstHostTest, MemlockBelowRegionIsAWarningNamingFixes) {
  HostFacts facts = RoomyHost();
  facts.memlock = {8 * kMiB, 8 * kMiB};
  EXPECT_THAT(
      CheckOptionsAgainstHost(WithRegion(4 * kGiB), facts),
      ElementsAre(IsClash(
          HostClash::Level::kWarning,
          AllOf(HasSubstr("8388608 (8.00M)"),
                HasSubstr("TPU_PREMAPPED_BUFFER_SIZE=4294967296 (4.00G)"),
                HasSubstr("CAP_IPC_LOCK"), HasSubstr("ulimit -l"),
                HasSubstr("limits.conf"), HasSubstr("memlock"),
                HasSubstr("--ulimit memlock=-1"),
                HasSubstr("LimitMEMLOCK=infinity")))));
}

TEST(CheckOptionsAgainstHostTest, MemlockSuggestsTheKiBWhenTheHardLimitAllows) {
  HostFacts facts = RoomyHost();
  facts.memlock = {8 * kMiB, ResourceLimit::kUnlimited};
  EXPECT_THAT(CheckOptionsAgainstHost(WithRegion(4 * kGiB), facts),
              ElementsAre(IsClash(HostClash::Level::kWarning,
                                  HasSubstr("`ulimit -l 4194304`"))));
  facts.memlock = {8 * kMiB, 8 * kMiB};
  EXPECT_THAT(CheckOptionsAgainstHost(WithRegion(4 * kGiB), facts),
              ElementsAre(IsClash(HostClash::Level::kWarning,
                                  HasSubstr("`ulimit -l unlimited`"))));
}

TEST(CheckOptionsAgainstHostTest, MemlockBelowRegionIsAnErrorWhenRequired) {
  HostFacts facts = RoomyHost();
  facts.memlock = {64 * kKiB, 64 * kKiB};
  Options options = WithRegion(4 * kGiB);
  options.mlock.value = MlockMode::kRequired;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts),
              ElementsAre(IsClash(HostClash::Level::kError,
                                  AllOf(HasSubstr("65536 (64.0K)"),
                                        HasSubstr("TPUSHIM_MLOCK=required")))));
}

TEST(CheckOptionsAgainstHostTest, MemlockIsNotCheckedWhenOffOrCapable) {
  HostFacts facts = RoomyHost();
  facts.memlock = {64 * kKiB, 64 * kKiB};
  Options options = WithRegion(4 * kGiB);
  options.mlock.value = MlockMode::kOff;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts), IsEmpty());
  options.mlock.value = MlockMode::kRequired;
  facts.has_cap_ipc_lock = true;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts), IsEmpty());
}

TEST(CheckOptionsAgainstHostTest, HugetlbWithoutEnoughFreePagesIsAnError) {
  HostFacts facts = RoomyHost();
  // 2 MiB pool: 2000 free but 100 of them reserved -> 1900 < 2048 needed.
  facts.hugepage_pools = {{2 * kMiB, 2000, 2000, 100}, {1 * kGiB, 2, 2, 0}};
  Options options = WithRegion(4 * kGiB);
  options.hugepages.value = HugePagesMode::kHugetlb;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts),
              ElementsAre(IsClash(
                  HostClash::Level::kError,
                  AllOf(HasSubstr("needs 2048 free 2048kB huge pages"),
                        HasSubstr("only 1900"),
                        HasSubstr("echo 2148 | sudo tee "
                                  "/sys/kernel/mm/hugepages/hugepages-2048kB/"
                                  "nr_hugepages"),
                        HasSubstr("TPUSHIM_HUGEPAGES=auto")))));
}

TEST(CheckOptionsAgainstHostTest, HugetlbIsFineWhenAnyPoolHoldsTheRegion) {
  Options options = WithRegion(4 * kGiB);
  options.hugepages.value = HugePagesMode::kHugetlb;
  HostFacts facts = RoomyHost();
  facts.hugepage_pools = {{2 * kMiB, 2048, 2048, 0}, {1 * kGiB, 0, 0, 0}};
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts), IsEmpty());
  facts.hugepage_pools = {{2 * kMiB, 0, 0, 0}, {1 * kGiB, 4, 4, 0}};
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts), IsEmpty());
}

TEST(CheckOptionsAgainstHostTest, HugetlbWithoutPoolsIsAnError) {
  HostFacts facts = RoomyHost();
  facts.hugepage_pools.clear();
  Options options = WithRegion(4 * kGiB);
  options.hugepages.value = HugePagesMode::kHugetlb;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts),
              ElementsAre(IsClash(HostClash::Level::kError,
                                  HasSubstr("no huge page pools"))));
}

TEST(CheckOptionsAgainstHostTest, HugetlbPoolsAreNotCheckedInOtherModes) {
  Options options = WithRegion(4 * kGiB);
  for (HugePagesMode mode :
       {HugePagesMode::kAuto, HugePagesMode::kThp, HugePagesMode::kOff}) {
    options.hugepages.value = mode;
    EXPECT_THAT(CheckOptionsAgainstHost(options, RoomyHost()), IsEmpty());
  }
}

TEST(CheckOptionsAgainstHostTest, ThpModeWithThpNeverIsAnError) {
  HostFacts facts = RoomyHost();
  facts.thp_enabled = "never";
  Options options = WithRegion(4 * kGiB);
  options.hugepages.value = HugePagesMode::kThp;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts),
              ElementsAre(IsClash(
                  HostClash::Level::kError,
                  AllOf(HasSubstr("\"never\""), HasSubstr("echo madvise")))));
  facts.thp_enabled = "";
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts),
              ElementsAre(IsClash(HostClash::Level::kError,
                                  HasSubstr("no transparent huge pages"))));
}

TEST(CheckOptionsAgainstHostTest, ThpModeIsFineWithAlwaysOrMadvise) {
  HostFacts facts = RoomyHost();
  Options options = WithRegion(4 * kGiB);
  options.hugepages.value = HugePagesMode::kThp;
  for (const char* word : {"always", "madvise"}) {
    facts.thp_enabled = word;
    EXPECT_THAT(CheckOptionsAgainstHost(options, facts), IsEmpty());
  }
  facts.thp_enabled = "never";
  options.hugepages.value = HugePagesMode::kAuto;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts), IsEmpty());
}

TEST(CheckOptionsAgainstHostTest, NumaNodeBeyondTheHostIsAnError) {
  Options options;
  options.numa_node.value = 2;
  EXPECT_THAT(CheckOptionsAgainstHost(options, RoomyHost()),
              ElementsAre(IsClash(HostClash::Level::kError,
                                  AllOf(HasSubstr("TPUSHIM_NUMA_NODE=2"),
                                        HasSubstr("nodes 0, 1")))));
}

TEST(CheckOptionsAgainstHostTest, ExistingOrAutoNumaNodeIsFine) {
  Options options;
  options.numa_node.value = 1;
  EXPECT_THAT(CheckOptionsAgainstHost(options, RoomyHost()), IsEmpty());
  options.numa_node.value = std::nullopt;
  EXPECT_THAT(CheckOptionsAgainstHost(options, RoomyHost()), IsEmpty());
}

TEST(CheckOptionsAgainstHostTest, RegionOffChecksOnlyTheNumaNode) {
  HostFacts facts = RoomyHost();
  facts.mem_available_bytes = 0;
  facts.memlock = {0, 0};
  facts.thp_enabled = "never";
  facts.hugepage_pools.clear();
  Options options = WithRegion(0);
  options.mlock.value = MlockMode::kRequired;
  options.hugepages.value = HugePagesMode::kHugetlb;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts), IsEmpty());
  options.numa_node.value = 5;
  EXPECT_THAT(CheckOptionsAgainstHost(options, facts),
              ElementsAre(IsClash(HostClash::Level::kError,
                                  HasSubstr("TPUSHIM_NUMA_NODE=5"))));
}

TEST(CheckOptionsAgainstHostTest, EveryClashIsOneSentence) {
  HostFacts facts = RoomyHost();
  facts.mem_available_bytes = 1 * kGiB;
  facts.memlock = {8 * kMiB, 8 * kMiB};
  facts.thp_enabled = "never";
  Options options = WithRegion(4 * kGiB);
  options.hugepages.value = HugePagesMode::kThp;
  options.numa_node.value = 7;
  const std::vector<HostClash> clashes =
      CheckOptionsAgainstHost(options, facts);
  ASSERT_THAT(clashes, SizeIs(4));
  for (const HostClash& clash : clashes) {
    EXPECT_THAT(clash.message, Not(HasSubstr("\n")));
    EXPECT_TRUE(absl::EndsWith(clash.message, ".")) << clash.message;
  }
}

}  // namespace
}  // namespace tpushim
