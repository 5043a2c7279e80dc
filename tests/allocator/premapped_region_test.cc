#include "allocator/premapped_region.h"

#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"

namespace tpushim {

void PrintTo(HugePagesMode mode, std::ostream* os) {
  *os << HugePagesModeName(mode);
}

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// The real OS with a controlled environment and host facts. Variables not
// in `env` are unset, whatever the test process has.
class FakeHostOs : public OsWrapper {
 public:
  explicit FakeHostOs(Os* target) : OsWrapper(target) {}

  std::map<std::string, std::string> env;
  std::map<std::string, std::string> files;  // overrides of ReadFile
  std::optional<ResourceLimit> memlock;
  std::optional<bool> ipc_lock;
  bool madvise_populate_unsupported = false;
  int mmap_calls = 0;
  int mlock_calls = 0;

  std::optional<std::string> GetEnv(const std::string& name) override {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    auto it = files.find(path);
    if (it != files.end()) return it->second;
    return OsWrapper::ReadFile(path);
  }
  absl::StatusOr<ResourceLimit> GetMemlockLimit() override {
    if (memlock) return *memlock;
    return OsWrapper::GetMemlockLimit();
  }
  bool HasIpcLockCapability() override {
    return ipc_lock.value_or(OsWrapper::HasIpcLockCapability());
  }
  absl::StatusOr<void*> Mmap(void* addr, size_t length, int prot, int flags,
                             int fd, off_t offset) override {
    ++mmap_calls;
    return OsWrapper::Mmap(addr, length, prot, flags, fd, offset);
  }
  absl::Status Mlock(const void* addr, size_t length, LockWhen when) override {
    ++mlock_calls;
    return OsWrapper::Mlock(addr, length, when);
  }
  absl::Status Madvise(void* addr, size_t length, int advice) override {
    if (advice == MADV_POPULATE_WRITE && madvise_populate_unsupported) {
      return absl::ErrnoToStatus(EINVAL, "madvise");
    }
    if (advice == MADV_POPULATE_WRITE) {
      {
        std::lock_guard<std::mutex> lock(populate_mu);
        populating_threads.insert(ThreadId());
      }
      if (slow_populate) absl::SleepFor(absl::Milliseconds(5));
    }
    return OsWrapper::Madvise(addr, length, advice);
  }

  // Threads that pre-faulted (MADV_POPULATE_WRITE), each call slowed down
  // when `slow_populate` so that every thread gets a share.
  bool slow_populate = false;
  std::mutex populate_mu;
  std::set<pid_t> populating_threads;
};

Options Resolve(Os& os, OptionOverrides overrides = {}) {
  absl::StatusOr<Options> options = ResolveOptions(os, overrides);
  EXPECT_TRUE(options.ok()) << options.status();
  return *options;
}

OptionOverrides Size(uint64_t bytes) {
  OptionOverrides o;
  o.premapped_buffer_size = bytes;
  return o;
}

TEST(PremappedRegionTest, MapsPrefaultsAndPinsTheRegion) {
  FakeHostOs host(Os::Default());
  FaultInjectingOs os(&host, nullptr);
  const Options options = Resolve(host, Size(8 * kMiB));
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(options, &os, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_NE(*region, nullptr);
  PremappedRegion& r = **region;
  EXPECT_EQ(r.size(), 8 * kMiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r.base()) % 4096, 0u);
  const PremappedRegion::Stats stats = r.GetStats();
  EXPECT_TRUE(stats.locked);  // tests run as root, with CAP_IPC_LOCK
  EXPECT_GE(os.locked_bytes(), 8 * kMiB);
  EXPECT_GE(stats.prefault_threads, 1);
  EXPECT_EQ(stats.allocator.capacity_bytes, 8 * kMiB);
  if (stats.page_kind != PageKind::k4K) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.base()) % (2 * kMiB), 0u);
  }
  // The memory is usable through the allocator.
  absl::StatusOr<void*> p = r.allocator().Allocate(kMiB);
  ASSERT_TRUE(p.ok());
  std::memset(*p, 0x5a, kMiB);
  EXPECT_TRUE(r.allocator().Contains(*p, kMiB));
  ASSERT_TRUE(r.allocator().Free(*p).ok());
  region->reset();
  EXPECT_EQ(os.mapped_bytes(), 0u);
  EXPECT_EQ(os.locked_bytes(), 0u);
}

// Each of `expected` found in `text`, in this order.
void ExpectInOrder(const std::string& text,
                   const std::vector<std::string>& expected) {
  size_t at = 0;
  for (const std::string& e : expected) {
    const size_t found = text.find(e, at);
    ASSERT_NE(found, std::string::npos)
        << "missing (in order): " << e << "\nlog:\n"
        << text;
    at = found + e.size();
  }
}

using testutil::ScopedTestLogging;

TEST(PremappedRegionTest, LogsTheStartupLinesInOrder) {
  ScopedTestLogging logs;
  FakeHostOs host(Os::Default());
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, Size(8 * kMiB)), &host, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  const PremappedRegion::Stats stats = (*region)->GetStats();
  ExpectInOrder(
      logs.File("INFO"),
      {"] TPU premapped buffer enabled. Size: 8388608 Threshold: 8388608\n",
       absl::StrCat("] Creating numa aware allocators, number of NUMA nodes ",
                    host.NumaNodeCount(), "\n"),
       "] Starting premapped memory manager initialization...\n",
       "] Premapped buffer is using alignment 64\n",
       absl::StrCat("] mlock()-ed 8388608 bytes for premapped region, using ",
                    host.mlock_calls, " syscalls.\n"),
       "] Done premapping memory of size 8388608 in ",
       absl::StrCat("s (", stats.page_description, ", ", stats.prefault_threads,
                    " threads, NUMA node ", stats.numa_node, ")\n"),
       "] Done allocating premapped memory of size 8388608\n"});
  // The count is of the calls made: one mlock2(MLOCK_ONFAULT) pins the
  // whole region.
  EXPECT_EQ(host.mlock_calls, 1);
}

TEST(PremappedRegionTest, LogsDisabledWhenTheSizeIsZero) {
  ScopedTestLogging logs;
  FakeHostOs host(Os::Default());
  ASSERT_TRUE(
      PremappedRegion::Create(Resolve(host, Size(0)), &host, nullptr).ok());
  const std::string info = logs.File("INFO");
  ExpectInOrder(info, {"] TPU premapped buffer disabled.\n",
                       "] Creating numa aware allocators, number of NUMA "
                       "nodes "});
  EXPECT_THAT(info, Not(HasSubstr("Starting premapped memory manager")));
}

// A pre-fault that takes longer than a second reports its progress.
class SlowPopulateOs : public FakeHostOs {
 public:
  using FakeHostOs::FakeHostOs;
  absl::Status Madvise(void* addr, size_t length, int advice) override {
    if (advice == MADV_POPULATE_WRITE && !slept_.exchange(true)) {
      absl::SleepFor(absl::Milliseconds(1500));
    }
    return FakeHostOs::Madvise(addr, length, advice);
  }

 private:
  std::atomic<bool> slept_{false};
};

TEST(PremappedRegionTest, ReportsProgressWhilePrefaulting) {
  ScopedTestLogging logs;
  SlowPopulateOs host(Os::Default());
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, Size(8 * kMiB)), &host, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  ExpectInOrder(logs.File("INFO"),
                {"] Premapped buffer is using alignment 64\n",
                 "] Premapping memory: ", " of 8388608 bytes (", "%)\n",
                 "] Done premapping memory of size 8388608"});
}

TEST(PremappedRegionTest, SizeZeroIsNoRegion) {
  FakeHostOs host(Os::Default());
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, Size(0)), &host, nullptr);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(*region, nullptr);
  EXPECT_EQ(host.mmap_calls, 0);
}

class PageKindTest : public ::testing::TestWithParam<HugePagesMode> {};

TEST_P(PageKindTest, EachModeStartsOrSaysWhyNot) {
  FakeHostOs host(Os::Default());
  FaultInjectingOs os(&host, nullptr);
  OptionOverrides o = Size(4 * kMiB);
  o.hugepages = GetParam();
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &os, nullptr);
  if (region.ok()) {
    const PageKind kind = (*region)->GetStats().page_kind;
    if (GetParam() == HugePagesMode::kOff) {
      EXPECT_EQ(kind, PageKind::k4K);
    }
    if (GetParam() == HugePagesMode::kThp) {
      EXPECT_EQ(kind, PageKind::kThp);
    }
    if (GetParam() == HugePagesMode::kHugetlb) {
      EXPECT_EQ(kind, PageKind::kHugetlb);
    }
  } else {
    // Only an explicit huge-page mode may fail, and only for lack of pages.
    EXPECT_TRUE(GetParam() == HugePagesMode::kHugetlb ||
                GetParam() == HugePagesMode::kThp)
        << region.status();
    EXPECT_THAT(std::string(region.status().message()),
                HasSubstr("TPUSHIM_HUGEPAGES="));
  }
  region = absl::InternalError("released");
  EXPECT_EQ(os.mapped_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, PageKindTest,
    ::testing::Values(HugePagesMode::kAuto, HugePagesMode::kHugetlb,
                      HugePagesMode::kThp, HugePagesMode::kOff),
    [](const auto& test_info) {
      return std::string(HugePagesModeName(test_info.param));
    });

TEST(PremappedRegionTest, HugetlbWithoutReservedPagesFailsBeforeMapping) {
  FakeHostOs host(Os::Default());
  OptionOverrides o = Size(4 * kMiB);
  o.hugepages = HugePagesMode::kHugetlb;
  // Whatever the host has, a pool with no free pages cannot serve.
  absl::StatusOr<std::vector<std::string>> pools =
      host.ListDirectory("/sys/kernel/mm/hugepages");
  if (pools.ok()) {
    for (const std::string& pool : *pools) {
      host.files["/sys/kernel/mm/hugepages/" + pool + "/free_hugepages"] =
          "0\n";
    }
  }
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &host, nullptr);
  EXPECT_EQ(region.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(region.status().message()),
              HasSubstr("TPUSHIM_HUGEPAGES=hugetlb"));
  EXPECT_EQ(host.mmap_calls, 0);
}

TEST(PremappedRegionTest, ThpNeverFailsUnderThpMode) {
  FakeHostOs host(Os::Default());
  host.files["/sys/kernel/mm/transparent_hugepage/enabled"] =
      "always madvise [never]\n";
  OptionOverrides o = Size(4 * kMiB);
  o.hugepages = HugePagesMode::kThp;
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &host, nullptr);
  EXPECT_EQ(region.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(region.status().message()), HasSubstr("\"never\""));
  EXPECT_EQ(host.mmap_calls, 0);
}

std::string FakeMeminfo(uint64_t available_kb) {
  return absl::StrCat("MemTotal:       25165824 kB\nMemFree:        1000 kB\n",
                      "MemAvailable:   ", available_kb, " kB\n");
}

TEST(PremappedRegionTest, RegionLargerThanMemAvailableFailsUntouched) {
  FakeHostOs host(Os::Default());
  host.files["/proc/meminfo"] = FakeMeminfo(512 * 1024);  // 512 MiB
  OptionOverrides o = Size(1024 * kMiB);
  o.hugepages = HugePagesMode::kOff;
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &host, nullptr);
  ASSERT_EQ(region.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(region.status().message());
  EXPECT_THAT(message, HasSubstr("Cannot premap TPU_PREMAPPED_BUFFER_SIZE="
                                 "1073741824 (1.00G)"));
  EXPECT_THAT(message, HasSubstr("MemAvailable is 536870912 (512.00M)"));
  EXPECT_THAT(message, HasSubstr("cgroup"));
  EXPECT_EQ(host.mmap_calls, 0);
}

TEST(PremappedRegionTest, RegionLargerThanTheCgroupAllowsFailsUntouched) {
  FakeHostOs host(Os::Default());
  host.files["/proc/self/cgroup"] = "0::/\n";
  host.files["/sys/fs/cgroup/cgroup.controllers"] = "cpu io memory pids\n";
  host.files["/sys/fs/cgroup/memory.max"] = "268435456\n";      // 256 MiB
  host.files["/sys/fs/cgroup/memory.current"] = "134217728\n";  // 128 MiB
  host.files["/sys/fs/cgroup/memory.stat"] = "inactive_file 0\n";
  OptionOverrides o = Size(256 * kMiB);
  o.hugepages = HugePagesMode::kOff;
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &host, nullptr);
  ASSERT_EQ(region.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(region.status().message());
  EXPECT_THAT(message, HasSubstr("MemAvailable is "));
  EXPECT_THAT(message, HasSubstr("the cgroup memory limit is 268435456 "
                                 "(256.00M) with 134217728 (128.00M) in use"));
  EXPECT_EQ(host.mmap_calls, 0);
}

TEST(PremappedRegionTest, HeadroomIsKeptFree) {
  FakeHostOs host(Os::Default());
  host.files["/proc/meminfo"] = FakeMeminfo(100 * 1024);  // 100 MiB
  OptionOverrides o = Size(64 * kMiB);  // fits, but not with 64M+2% headroom
  o.hugepages = HugePagesMode::kOff;
  EXPECT_EQ(
      PremappedRegion::Create(Resolve(host, o), &host, nullptr).status().code(),
      absl::StatusCode::kResourceExhausted);
  o.premapped_buffer_size = 16 * kMiB;
  EXPECT_TRUE(PremappedRegion::Create(Resolve(host, o), &host, nullptr).ok());
}

TEST(PremappedRegionTest, SmallMemlockLimitWarnsAndRunsUnpinned) {
  FakeHostOs host(Os::Default());
  host.memlock = ResourceLimit{64 * 1024, 64 * 1024};
  host.ipc_lock = false;
  FaultInjectingOs os(&host, nullptr);
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, Size(4 * kMiB)), &os, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  const PremappedRegion::Stats stats = (*region)->GetStats();
  EXPECT_FALSE(stats.locked);
  // It remembers why: the limit, with what to do about it.
  EXPECT_EQ(stats.lock_error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(stats.lock_error.message(),
              HasSubstr("RLIMIT_MEMLOCK soft limit of 65536 (64.0K)"));
  EXPECT_EQ(host.mlock_calls, 0);
  EXPECT_EQ(os.locked_bytes(), 0u);
}

// A failed mlock call is remembered with its status (the start-up WARNING's
// cause), not guessed from the memlock limit.
TEST(PremappedRegionTest, FailedMlockIsRememberedWithItsStatus) {
  testutil::ScopedTestLogging logs;
  FakeHostOs host(Os::Default());
  host.ipc_lock = true;
  absl::StatusOr<FaultSpec> spec = ParseFaultSpec("mlock:nth=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  FaultInjector faults(*spec);
  FaultInjectingOs os(&host, &faults);
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, Size(4 * kMiB)), &os, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  const PremappedRegion::Stats stats = (*region)->GetStats();
  EXPECT_FALSE(stats.lock_requested);
  EXPECT_FALSE(stats.locked);
  EXPECT_EQ(stats.lock_error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(stats.lock_error.message(),
              AllOf(HasSubstr("mlock() of the premapped region failed: "),
                    HasSubstr("[injected: mlock:nth=1]"),
                    Not(HasSubstr("CAP_IPC_LOCK"))));
  EXPECT_EQ(os.locked_bytes(), 0u);
}

TEST(PremappedRegionTest, SmallMemlockLimitFailsWhenRequired) {
  FakeHostOs host(Os::Default());
  host.memlock = ResourceLimit{64 * 1024, 64 * 1024};
  host.ipc_lock = false;
  OptionOverrides o = Size(4 * kMiB);
  o.mlock = MlockMode::kRequired;
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &host, nullptr);
  ASSERT_EQ(region.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(region.status().message());
  EXPECT_THAT(message, HasSubstr("RLIMIT_MEMLOCK soft limit of 65536 (64.0K)"));
  EXPECT_THAT(message, HasSubstr("ulimit -l"));
  EXPECT_EQ(host.mmap_calls, 0);
}

TEST(PremappedRegionTest, MlockOffNeverLocks) {
  FakeHostOs host(Os::Default());
  OptionOverrides o = Size(4 * kMiB);
  o.mlock = MlockMode::kOff;
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &host, nullptr);
  ASSERT_TRUE(region.ok());
  EXPECT_FALSE((*region)->GetStats().locked);
  EXPECT_TRUE((*region)->GetStats().lock_error.ok());  // nothing failed
  EXPECT_EQ(host.mlock_calls, 0);
}

TEST(PremappedRegionTest, NonexistentNumaNodeIsInvalidArgument) {
  FakeHostOs host(Os::Default());
  OptionOverrides o = Size(4 * kMiB);
  o.numa_node = std::optional<int>(host.NumaNodeCount());
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &host, nullptr);
  EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(region.status().message()),
              HasSubstr("TPUSHIM_NUMA_NODE="));
  EXPECT_EQ(host.mmap_calls, 0);
}

TEST(PremappedRegionTest, PrefaultsOnSeveralThreads) {
  FakeHostOs host(Os::Default());
  host.slow_populate = true;
  OptionOverrides o = Size(16 * kMiB);
  o.prefault_threads = 2;
  o.hugepages = HugePagesMode::kOff;
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &host, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->GetStats().prefault_threads, 2);
  std::lock_guard<std::mutex> lock(host.populate_mu);
  EXPECT_EQ(host.populating_threads.size(), 2u);
}

TEST(PremappedRegionTest, KernelsWithoutPopulateWriteFallBackToTouching) {
  FakeHostOs host(Os::Default());
  host.madvise_populate_unsupported = true;
  OptionOverrides o = Size(8 * kMiB);
  o.prefault_threads = 2;
  absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
      PremappedRegion::Create(Resolve(host, o), &host, nullptr);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->GetStats().prefault_threads, 2);
}

// Every injectable call of start-up and teardown, failed in turn: each run
// ends with a clean status and nothing mapped or locked.
struct SweepCase {
  const char* name;
  MlockMode mlock;
  bool explicit_node;
  HugePagesMode hugepages;
};

void PrintTo(const SweepCase& c, std::ostream* os) { *os << c.name; }

class StartupFailureSweepTest : public ::testing::TestWithParam<SweepCase> {};

TEST_P(StartupFailureSweepTest, NothingLeaksWhateverFails) {
  ScopedTestLogging logs;  // fails on purpose: ERRORs off stderr
  FakeHostOs host(Os::Default());
  FaultInjector faults;
  FaultInjectingOs os(&host, &faults);
  OptionOverrides o = Size(8 * kMiB);
  o.mlock = GetParam().mlock;
  o.hugepages = GetParam().hugepages;
  o.prefault_threads = 2;
  if (GetParam().explicit_node) o.numa_node = std::optional<int>(0);
  const Options options = Resolve(host, o);
  int failed_runs = 0;
  absl::StatusOr<uint64_t> runs =
      RunWithCountedFailures(faults, FaultPointSet::All(), [&](uint64_t n) {
        absl::StatusOr<std::unique_ptr<PremappedRegion>> region =
            PremappedRegion::Create(options, &os, &faults);
        if (!region.ok()) {
          ++failed_runs;
          EXPECT_THAT(std::string(region.status().message()),
                      HasSubstr("[injected: counted failure at call"))
              << "run " << n << ": " << region.status();
        } else {
          ASSERT_NE(*region, nullptr);
          // The region serves allocations even after a tolerated failure.
          absl::StatusOr<void*> p = (*region)->allocator().Allocate(4096);
          if (p.ok()) {
            EXPECT_TRUE((*region)->allocator().Free(*p).ok());
          }
          region->reset();
        }
        EXPECT_EQ(os.mapped_bytes(), 0u) << "run " << n;
        EXPECT_EQ(os.locked_bytes(), 0u) << "run " << n;
      });
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_GE(*runs, 4u);
  EXPECT_GE(failed_runs, 1);
}

INSTANTIATE_TEST_SUITE_P(
    Configurations, StartupFailureSweepTest,
    ::testing::Values(
        SweepCase{"Defaults", MlockMode::kOn, false, HugePagesMode::kAuto},
        SweepCase{"Required", MlockMode::kRequired, true, HugePagesMode::kAuto},
        SweepCase{"SmallPages", MlockMode::kRequired, true,
                  HugePagesMode::kOff}),
    [](const auto& test_info) { return std::string(test_info.param.name); });

}  // namespace
}  // namespace tpushim
