// The premapped region reports what the kernel did, not what it asked for:
// the page kind and size from /proc/self/smaps, the locked bytes the
// kernel holds, the NUMA policy in force. Through the injectable OS layer
// (a kernel that ignores the advice or the lock), and for real where the
// machine allows (tests run as root: hugetlb pages are reserved for the
// test and given back).

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "allocator/premapped_region.h"
#include "env/fault_injection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// The real OS with an empty environment, optionally faking what smaps and
// a few host files say.
class HostOs : public OsWrapper {
 public:
  explicit HostOs(Os* target) : OsWrapper(target) {}
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> files;
  // Rewrites each "<Key>:" line of smaps to "<Key>: 0 kB".
  std::vector<std::string> zero_smaps_keys;

  std::optional<std::string> GetEnv(const std::string& name) override {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::string> EnvironmentNames() override { return {}; }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    auto it = files.find(path);
    if (it != files.end()) return it->second;
    absl::StatusOr<std::string> text = OsWrapper::ReadFile(path);
    if (!text.ok() || path != "/proc/self/smaps" || zero_smaps_keys.empty()) {
      return text;
    }
    std::string out;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      bool zeroed = false;
      for (const std::string& key : zero_smaps_keys) {
        if (absl::StartsWith(line, key + ":")) {
          absl::StrAppend(&out, key, ":        0 kB\n");
          zeroed = true;
        }
      }
      if (!zeroed) absl::StrAppend(&out, line, "\n");
    }
    return out;
  }
};

absl::StatusOr<std::unique_ptr<PremappedRegion>> Create(
    HostOs& host, uint64_t size, HugePagesMode mode) {
  OptionOverrides o;
  o.premapped_buffer_size = size;
  o.hugepages = mode;
  absl::StatusOr<Options> options = ResolveOptions(host, o);
  if (!options.ok()) return options.status();
  return PremappedRegion::Create(*options, &host, nullptr);
}

bool IsRoot() { return geteuid() == 0; }

// Whether mlock really locks in this build: the sanitizer runtimes'
// interceptor of mlock() returns success without locking.
constexpr bool kMlockIntercepted =
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    true;
#else
    false;
#endif
#else
    false;
#endif

TEST(RegionPagesTest, TransparentHugePagesAdvisedButNotGivenAreCalledSo) {
  testutil::ScopedTestLogging logs;
  HostOs host(Os::Default());
  host.files["/sys/kernel/mm/transparent_hugepage/enabled"] =
      "always [madvise] never\n";
  host.zero_smaps_keys = {"AnonHugePages"};  // the kernel gave none
  auto region = Create(host, 8 * kMiB, HugePagesMode::kThp);
  ASSERT_TRUE(region.ok()) << region.status();
  const PremappedRegion::Stats s = (*region)->GetStats();
  EXPECT_EQ(s.page_kind, PageKind::k4K);
  EXPECT_EQ(s.page_kind_asked, PageKind::kThp);
  EXPECT_EQ(s.page_bytes, 4096u);
  EXPECT_EQ(s.huge_page_bytes, 0u);
  EXPECT_EQ(s.page_description,
            "4 KiB pages (transparent huge pages advised but not given)");
  EXPECT_THAT(logs.File("INFO"),
              HasSubstr("s (4 KiB pages (transparent huge pages advised but "
                        "not given), "));
}

TEST(RegionPagesTest, LockedBytesAreWhatTheKernelHolds) {
  testutil::ScopedTestLogging logs;
  HostOs host(Os::Default());
  host.zero_smaps_keys = {"Locked"};  // an mlock that "succeeded"
  auto region = Create(host, 8 * kMiB, HugePagesMode::kOff);
  ASSERT_TRUE(region.ok()) << region.status();
  const PremappedRegion::Stats s = (*region)->GetStats();
  EXPECT_EQ(s.locked_bytes, 0u);
  EXPECT_FALSE(s.locked);
  EXPECT_EQ(s.lock_error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.lock_error.message(),
              HasSubstr("mlock() of the premapped region succeeded, but the "
                        "kernel holds only 0 of its 8388608 bytes locked"));
  EXPECT_THAT(logs.File("INFO"), Not(HasSubstr("mlock()-ed")));
  EXPECT_THAT(logs.File("WARNING"),
              HasSubstr("mlock() of the premapped region succeeded, but the "
                        "kernel holds only 0 of its 8388608 bytes locked"));
}

TEST(RegionPagesTest, WhatCannotBeReadBackIsReportedAsAskedWithAWarning) {
  testutil::ScopedTestLogging logs;
  HostOs host(Os::Default());
  host.files["/proc/self/smaps"] = "";  // not smaps
  auto region = Create(host, 4 * kMiB, HugePagesMode::kOff);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->GetStats().page_kind, PageKind::k4K);
  EXPECT_THAT(logs.File("WARNING"),
              HasSubstr("Cannot read back how the premapped region is "
                        "backed"));
}

// ---- For real --------------------------------------------------------------

TEST(RegionPagesTest, FourKiBPagesAndTheLockForReal) {
  HostOs host(Os::Default());
  auto region = Create(host, 8 * kMiB, HugePagesMode::kOff);
  ASSERT_TRUE(region.ok()) << region.status();
  const PremappedRegion::Stats s = (*region)->GetStats();
  EXPECT_EQ(s.page_kind, PageKind::k4K);
  EXPECT_EQ(s.huge_page_bytes, 0u);
  if (IsRoot() && !kMlockIntercepted) {
    EXPECT_EQ(s.locked_bytes, 8 * kMiB);
    EXPECT_TRUE(s.locked);
  }
  EXPECT_EQ(s.locked, s.locked_bytes >= 8 * kMiB);
}

TEST(RegionPagesTest, TransparentHugePagesForReal) {
  HostOs host(Os::Default());
  absl::StatusOr<std::string> enabled =
      Os::Default()->ReadFile("/sys/kernel/mm/transparent_hugepage/enabled");
  ASSERT_TRUE(enabled.ok()) << enabled.status();
  if (absl::StrContains(*enabled, "[never]")) {
    GTEST_SKIP() << "transparent huge pages are off on this host";
  }
  if (IsRoot()) {
    // Give the kernel free 2 MiB blocks to hand out.
    FILE* f = fopen("/proc/sys/vm/compact_memory", "w");
    if (f != nullptr) {
      fputs("1", f);
      fclose(f);
    }
  }
  auto region = Create(host, 32 * kMiB, HugePagesMode::kThp);
  ASSERT_TRUE(region.ok()) << region.status();
  const PremappedRegion::Stats s = (*region)->GetStats();
  EXPECT_EQ(s.page_kind_asked, PageKind::kThp);
  EXPECT_EQ(s.page_kind, PageKind::kThp) << s.page_description;
  EXPECT_GT(s.huge_page_bytes, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*region)->base()) % (2 * kMiB), 0u);
}

// Reserves `pages` hugetlb pages of the default size for the test's
// length, and gives them back.
class HugetlbReservation {
 public:
  explicit HugetlbReservation(int pages) {
    absl::StatusOr<std::string> before =
        Os::Default()->ReadFile(kPath);
    if (!before.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*before),
                                          &before_)) {
      return;
    }
    ok_ = Write(before_ + pages);
    absl::StatusOr<std::string> after = Os::Default()->ReadFile(kPath);
    int now = 0;
    ok_ = ok_ && after.ok() &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(*after), &now) &&
          now >= before_ + pages;
  }
  ~HugetlbReservation() { Write(before_); }
  bool ok() const { return ok_; }

 private:
  static constexpr char kPath[] = "/proc/sys/vm/nr_hugepages";
  static bool Write(int n) {
    FILE* f = fopen(kPath, "w");
    if (f == nullptr) return false;
    const bool ok = fprintf(f, "%d", n) > 0;
    return fclose(f) == 0 && ok;
  }
  int before_ = 0;
  bool ok_ = false;
};

TEST(RegionPagesTest, HugetlbPagesForReal) {
  if (!IsRoot()) GTEST_SKIP() << "reserving hugetlb pages needs root";
  HugetlbReservation reserved(8);
  ASSERT_TRUE(reserved.ok()) << "could not reserve 8 hugetlb pages";
  HostOs host(Os::Default());
  auto region = Create(host, 8 * kMiB, HugePagesMode::kHugetlb);
  ASSERT_TRUE(region.ok()) << region.status();
  const PremappedRegion::Stats s = (*region)->GetStats();
  EXPECT_EQ(s.page_kind, PageKind::kHugetlb) << s.page_description;
  EXPECT_EQ(s.page_bytes, 2 * kMiB);
  EXPECT_EQ(s.huge_page_bytes, 8 * kMiB);
  region->reset();  // before the reservation goes
}

TEST(RegionPagesTest, BoundToItsNumaNodeForReal) {
  HostOs host(Os::Default());
  auto region = Create(host, 4 * kMiB, HugePagesMode::kOff);
  ASSERT_TRUE(region.ok()) << region.status();
  const PremappedRegion::Stats s = (*region)->GetStats();
  absl::StatusOr<Os::MemoryPolicy> policy =
      Os::Default()->MemoryPolicyOf((*region)->base());
  if (!policy.ok()) GTEST_SKIP() << "no NUMA here: " << policy.status();
  EXPECT_EQ(s.numa_policy, "bind");
  ASSERT_EQ(s.numa_nodes.size(), 1u);
  EXPECT_EQ(s.numa_nodes[0], s.numa_node);
}

}  // namespace
}  // namespace tpushim
