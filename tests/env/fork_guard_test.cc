// The fork guard: memory excluded from fork() is not in a child at all,
// its addresses are reserved there with no access, and the process id is
// kept current across fork().

#include "env/fork_guard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "env/fault_injection.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fork_child.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::RunForkedChild;

class Mapping {
 public:
  explicit Mapping(size_t length) : length_(length) {
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
    if (base_ != nullptr) std::memset(base_, 0x5a, length);
  }
  ~Mapping() {
    if (base_ == nullptr) return;
    ForgetForkExclusion(base_);
    munmap(base_, length_);
  }
  char* base() const { return base_; }
  size_t length() const { return length_; }

 private:
  char* base_ = nullptr;
  size_t length_;
};

TEST(ForkGuardTest, ChildTouchingExcludedMemoryGetsSigsegv) {
  Mapping m(1 << 20);
  ASSERT_NE(m.base(), nullptr);
  ASSERT_TRUE(
      ExcludeFromFork(*Os::Default(), m.base(), m.length(), "a test").ok());
  EXPECT_TRUE(IsExcludedFromFork(m.base()));
  char* const p = m.base();
  const auto r = RunForkedChild([p] {
    // The kernel's verdict, not a sanitizer's SEGV handler's.
    signal(SIGSEGV, SIG_DFL);
    volatile char c = p[4096];  // the parent's byte: must fault
    return c == 0x5a ? 10 : 11;
  });
  EXPECT_TRUE(r.KilledBy(SIGSEGV)) << r.Describe();
  // The parent's memory is untouched by the fork.
  EXPECT_EQ(p[4096], 0x5a);
}

TEST(ForkGuardTest, ChildCannotReuseTheAddresses) {
  Mapping m(1 << 20);
  ASSERT_NE(m.base(), nullptr);
  ASSERT_TRUE(
      ExcludeFromFork(*Os::Default(), m.base(), m.length(), "a test").ok());
  char* const p = m.base();
  const size_t length = m.length();
  // A mapping the child asks for at exactly those addresses is refused: a
  // stale pointer can never reach one of the child's own allocations.
  const auto r = RunForkedChild([p, length] {
    void* q = mmap(p, length, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (q == p) return 1;  // the range was free: no reservation
    if (q != MAP_FAILED) return 2;
    return errno == EEXIST ? 0 : 3;
  });
  EXPECT_TRUE(r.Exited(0)) << r.Describe();
}

TEST(ForkGuardTest, MemoryNotExcludedIsInherited) {
  // The control: without ExcludeFromFork the child reads the parent's
  // bytes, so the test above fails if the advice is not given.
  Mapping m(1 << 16);
  ASSERT_NE(m.base(), nullptr);
  char* const p = m.base();
  const auto r = RunForkedChild([p] { return p[100] == 0x5a ? 0 : 1; });
  EXPECT_TRUE(r.Exited(0)) << r.Describe();
}

TEST(ForkGuardTest, ForgottenRangesAreNotReservedInTheChild) {
  Mapping m(1 << 16);
  ASSERT_NE(m.base(), nullptr);
  ASSERT_TRUE(
      ExcludeFromFork(*Os::Default(), m.base(), m.length(), "a test").ok());
  ForgetForkExclusion(m.base());
  EXPECT_FALSE(IsExcludedFromFork(m.base()));
  ASSERT_EQ(madvise(m.base(), m.length(), MADV_DOFORK), 0);
  char* const p = m.base();
  const auto r = RunForkedChild([p] { return p[100] == 0x5a ? 0 : 1; });
  EXPECT_TRUE(r.Exited(0)) << r.Describe();
}

TEST(ForkGuardTest, FailedAdviceNamesTheMemoryAndRecordsNothing) {
  Mapping m(1 << 16);
  ASSERT_NE(m.base(), nullptr);
  absl::StatusOr<FaultSpec> spec = ParseFaultSpec("madvise:nth=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  FaultInjector faults(*spec);
  FaultInjectingOs os(Os::Default(), &faults);
  const absl::Status s =
      ExcludeFromFork(os, m.base(), m.length(), "the test's buffer");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("the test's buffer"));
  EXPECT_THAT(s.message(), HasSubstr("MADV_DONTFORK"));
  EXPECT_FALSE(IsExcludedFromFork(m.base()));
}

TEST(ForkGuardTest, ProcessIdFollowsFork) {
  const pid_t parent = CurrentProcessId();
  EXPECT_EQ(parent, getpid());
  EXPECT_FALSE(ForkedChildOf(parent));
  const auto r = RunForkedChild([parent] {
    if (CurrentProcessId() != getpid()) return 1;
    if (!ForkedChildOf(parent)) return 2;
    const absl::Status s = ForkedChildError("This System", parent);
    if (s.code() != absl::StatusCode::kFailedPrecondition) return 3;
    return 0;
  });
  EXPECT_TRUE(r.Exited(0)) << r.Describe();
}

}  // namespace
}  // namespace tpushim
