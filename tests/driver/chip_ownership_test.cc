// Chips owned by Systems, across real processes: a holder started as a
// process of its own (chip_holder), refused creations that name it, the
// kernel letting go of a killed holder's chips, a System destroyed inside
// a live process giving its chips back, fork() children that never keep
// their parent's chips, a leftover /tmp/libtpu_lockfile that never blocks,
// and the lock calls under injected failures.
//
// Every child is bounded (killed after a timeout) and reaped; the run
// directory is the test process's own (tests/testing/private_run_dir.cc),
// so nothing is left locked for other tests.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "driver/system_internal.h"
#include "env/chips.h"
#include "env/fault_injection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/chip_holder_process.h"
#include "tests/testing/fork_child.h"
#include "tpushim/chips.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testutil::Holder;

OptionOverrides Small(const std::string& device, std::vector<int> chips = {}) {
  OptionOverrides o;
  o.device = device;
  o.premapped_buffer_size = 0;
  o.log_dir = "disabled";
  o.stderr_log_level = 3;
  if (!chips.empty()) o.visible_chips = chips;
  return o;
}

TEST(ChipOwnershipTest, ProcessesOnDisjointChipsRunSideBySide) {
  Holder holder(CHIP_HOLDER_PATH, "sim://?devices=2", "0");
  ASSERT_EQ(holder.ReadLine(), absl::StrCat("ready ", holder.pid()));
  absl::StatusOr<std::unique_ptr<System>> system =
      System::Create(Small("sim://?devices=2", {1}));
  ASSERT_TRUE(system.ok()) << system.status();
  ASSERT_EQ((*system)->device_count(), 1);
  EXPECT_EQ((*system)->device(0).host_chip, 1);
  EXPECT_EQ((*system)->device(0).name, "sim:0 (host chip 1)");
  // The chip works for transfers.
  absl::StatusOr<DeviceBuffer> buffer = (*system)->AllocateDevice(0, 4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<char> data(4096, 'x'), back(4096);
  absl::StatusOr<Event> to = (*system)->TransferToDevice(
      data.data(), *buffer, 0, data.size(), {},
      HostBufferSemantics::kImmutableUntilTransferCompletes);
  ASSERT_TRUE(to.ok()) << to.status();
  absl::StatusOr<Event> from = (*system)->TransferFromDevice(
      *buffer, 0, back.data(), back.size(), {*to},
      HostBufferSemantics::kImmutableUntilTransferCompletes);
  ASSERT_TRUE(from.ok()) << from.status();
  ASSERT_TRUE(from->Await().ok());
  EXPECT_EQ(back, data);
  EXPECT_EQ(holder.Finish(), 0);
}

TEST(ChipOwnershipTest, AnOwnedChipIsRefusedNamingItsHolder) {
  Holder holder(CHIP_HOLDER_PATH, "sim://?devices=2", "1");
  ASSERT_EQ(holder.ReadLine(), absl::StrCat("ready ", holder.pid()));
  absl::StatusOr<std::unique_ptr<System>> system =
      System::Create(Small("sim://?devices=2"));
  ASSERT_FALSE(system.ok());
  EXPECT_EQ(system.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(system.status().message(),
              AllOf(HasSubstr("sim chip 1 is held"),
                    HasSubstr(absl::StrCat("pid ", holder.pid())),
                    HasSubstr(absl::StrCat("user ", Os::Default()->UserName())),
                    HasSubstr("chip_holder sim://?devices=2 1"),
                    HasSubstr("since "), HasSubstr("tpushim info")));
  // The query sees the same holder, and chip 0 free: the refused creation
  // let go of the chip it had taken first.
  OptionOverrides q;
  q.device = "sim://?devices=2";
  absl::StatusOr<std::vector<ChipInfo>> chips = ListChips(q);
  ASSERT_TRUE(chips.ok()) << chips.status();
  ASSERT_EQ(chips->size(), 2u);
  EXPECT_FALSE((*chips)[0].held);
  EXPECT_TRUE((*chips)[1].held);
  ASSERT_TRUE((*chips)[1].holder.has_value());
  EXPECT_EQ((*chips)[1].holder->pid, holder.pid());
  EXPECT_EQ(holder.Finish(), 0);
}

TEST(ChipOwnershipTest, RefusalComesBeforeAnythingIsMapped) {
  Holder holder(CHIP_HOLDER_PATH, "sim://", "all");
  ASSERT_EQ(holder.ReadLine(), absl::StrCat("ready ", holder.pid()));
  FaultInjector faults(FaultSpec{});
  FaultInjectingOs os(Os::Default(), &faults);
  OptionOverrides o = Small("sim://");
  o.premapped_buffer_size = 1 << 20;
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(o, &os, &faults);
  ASSERT_FALSE(system.ok());
  EXPECT_EQ(system.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(faults.calls(FaultPoint::kMmap), 0u);
  EXPECT_EQ(os.mapped_bytes(), 0u);
  EXPECT_EQ(os.open_files(), 0u);
}

TEST(ChipOwnershipTest, SigkillOfTheHolderFreesItsChipsAtOnce) {
  Holder holder(CHIP_HOLDER_PATH, "sim://?devices=2", "all");
  ASSERT_EQ(holder.ReadLine(), absl::StrCat("ready ", holder.pid()));
  ASSERT_FALSE(System::Create(Small("sim://?devices=2", {0})).ok());
  holder.Kill();
  // No retry: the kernel dropped the locks when the process died.
  absl::StatusOr<std::unique_ptr<System>> system =
      System::Create(Small("sim://?devices=2"));
  EXPECT_TRUE(system.ok()) << system.status();
}

TEST(ChipOwnershipTest, ASystemDestroyedInALiveProcessGivesItsChipsBack) {
  Holder holder(CHIP_HOLDER_PATH, "sim://", "0");
  ASSERT_EQ(holder.ReadLine(), absl::StrCat("ready ", holder.pid()));
  ASSERT_FALSE(System::Create(Small("sim://")).ok());
  holder.Send("release");
  ASSERT_EQ(holder.ReadLine(), "released");
  // The holder lives on (a long-lived worker), without the chip.
  absl::StatusOr<std::unique_ptr<System>> system =
      System::Create(Small("sim://"));
  EXPECT_TRUE(system.ok()) << system.status();
  EXPECT_EQ(holder.Finish(), 0);
}

TEST(ChipOwnershipTest, TwoSystemsOfOneProcessCannotShareAChip) {
  absl::StatusOr<std::unique_ptr<System>> first =
      System::Create(Small("sim://?devices=2", {0}));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<System>> second =
      System::Create(Small("sim://?devices=2", {1, 0}));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              AllOf(HasSubstr("sim chip 0 is held"),
                    HasSubstr(absl::StrCat("pid ", getpid(), ",")),
                    HasSubstr("(this process)")));
  // Chip 1, taken before chip 0 was refused, was let go.
  absl::StatusOr<std::unique_ptr<System>> third =
      System::Create(Small("sim://?devices=2", {1}));
  EXPECT_TRUE(third.ok()) << third.status();
  first->reset();
  absl::StatusOr<std::unique_ptr<System>> again =
      System::Create(Small("sim://?devices=2", {0}));
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(ChipOwnershipTest, AForkChildNeverKeepsItsParentsChips) {
  absl::StatusOr<std::unique_ptr<System>> system =
      System::Create(Small("sim://"));
  ASSERT_TRUE(system.ok()) << system.status();
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t child = testutil::ForkChild([&] {
    char c = 1;
    (void)!write(ready[1], &c, 1);
    (void)!read(done[0], &c, 1);  // lives until the parent is done
    return 0;
  });
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  system->reset();
  // The child still runs, and has a copy of every descriptor but the
  // chips' lock files.
  absl::StatusOr<std::unique_ptr<System>> again =
      System::Create(Small("sim://"));
  EXPECT_TRUE(again.ok()) << again.status();
  (void)!write(done[1], &c, 1);
  EXPECT_TRUE(testutil::WaitForChild(child).Exited(0));
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
}

// Root and another user meet in a run directory the runtime creates (mode
// 1777, lock files 0666): each is refused naming the other, and each gets
// the chip once the other lets go. Needs root, to become nobody.
TEST(ChipOwnershipTest, RootAndAnotherUserShareTheRunDirectory) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run a process as nobody";
  constexpr int kNobody = 65534;
  const std::string own = getenv("TPUSHIM_RUN_DIR");
  const std::string shared = own + "/shared";  // made by the runtime
  ASSERT_EQ(chmod(own.c_str(), 0755), 0);      // nobody may look inside
  setenv("TPUSHIM_RUN_DIR", shared.c_str(), 1);
  {
    absl::StatusOr<std::unique_ptr<System>> mine =
        System::Create(Small("sim://"));
    ASSERT_TRUE(mine.ok()) << mine.status();
    struct stat st;
    ASSERT_EQ(stat(shared.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 01777u);
    Holder refused(CHIP_HOLDER_PATH, "sim://", "0", kNobody);
    EXPECT_THAT(refused.ReadLine(),
                AllOf(HasSubstr("error UNAVAILABLE"), HasSubstr("user root")));
  }
  Holder nobody(CHIP_HOLDER_PATH, "sim://", "0", kNobody);
  ASSERT_EQ(nobody.ReadLine(), absl::StrCat("ready ", nobody.pid()));
  absl::StatusOr<std::unique_ptr<System>> refused =
      System::Create(Small("sim://"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr(absl::StrCat("pid ", nobody.pid())),
                    HasSubstr("user nobody")));
  EXPECT_EQ(nobody.Finish(), 0);
  EXPECT_TRUE(System::Create(Small("sim://")).ok());
  setenv("TPUSHIM_RUN_DIR", own.c_str(), 1);
  unlink((shared + "/sim-0.lock").c_str());
  rmdir(shared.c_str());
}

TEST(ChipOwnershipTest, AStaleLibtpuLockfileNeverBlocks) {
  // Made here only when absent, and removed again: a real one is left alone.
  const bool made =
      access(kLibtpuLockfile, F_OK) != 0 && creat(kLibtpuLockfile, 0644) >= 0;
  absl::StatusOr<std::unique_ptr<System>> system =
      System::Create(Small("sim://"));
  EXPECT_TRUE(system.ok()) << system.status();
  EXPECT_TRUE(LibtpuLockfileAge(*Os::Default()).has_value());
  if (made) unlink(kLibtpuLockfile);
}

// An OS layer that fails the n-th call (from 1) that opens or locks a
// chip's lock file, as the kernel would (open: EACCES; fcntl: ENOLCK), and
// counts them. No fault point of TPUSHIM_FAULTS covers these calls (the
// points are fixed), so the sweep is this test's own.
class FailingLockOs : public OsWrapper {
 public:
  explicit FailingLockOs(Os* target) : OsWrapper(target) {}
  void FailCall(int n) {
    fail_at_ = n;
    calls_ = 0;
  }
  int calls() const { return calls_; }

  absl::StatusOr<int> OpenLockFile(const std::string& path,
                                   bool create) override {
    if (create && ++calls_ == fail_at_) {
      return absl::ErrnoToStatus(EACCES, absl::StrCat("open(", path, ")"));
    }
    absl::StatusOr<int> fd = OsWrapper::OpenLockFile(path, create);
    if (fd.ok()) ++open_;
    return fd;
  }
  absl::StatusOr<bool> TryLockFile(int fd) override {
    if (++calls_ == fail_at_) {
      return absl::ErrnoToStatus(ENOLCK, "fcntl(F_OFD_SETLK)");
    }
    return OsWrapper::TryLockFile(fd);
  }
  absl::Status Close(int fd) override {
    --open_;
    return OsWrapper::Close(fd);
  }
  int open() const { return open_; }

 private:
  int fail_at_ = 0;
  int calls_ = 0;
  std::atomic<int> open_{0};  // descriptors open (all kinds, from here on)
};

// Every open and lock of a chip's lock file failing in turn: a named
// error, and nothing left open or held (the next System gets the chips).
TEST(ChipOwnershipTest, AFailingLockCallIsNamedAndLeavesNothingHeld) {
  FailingLockOs os(Os::Default());
  const OptionOverrides o = Small("sim://?devices=2");
  os.FailCall(0);
  {
    absl::StatusOr<std::unique_ptr<System>> counting =
        SystemFactory::Create(o, &os);
    ASSERT_TRUE(counting.ok()) << counting.status();
  }
  const int calls = os.calls();
  EXPECT_EQ(calls, 4);  // two chips: an open and a lock each
  for (int n = 1; n <= calls; ++n) {
    os.FailCall(n);
    const int open_before = os.open();
    absl::StatusOr<std::unique_ptr<System>> system =
        SystemFactory::Create(o, &os);
    ASSERT_FALSE(system.ok()) << "call " << n;
    EXPECT_EQ(system.status().code(), n % 2 == 1
                                          ? absl::StatusCode::kPermissionDenied
                                          : absl::ErrnoToStatusCode(ENOLCK))
        << system.status();
    EXPECT_THAT(system.status().message(),
                AllOf(HasSubstr(absl::StrCat("sim chip ", (n - 1) / 2)),
                      HasSubstr(n % 2 == 1 ? "open(" : "fcntl(F_OFD_SETLK)")))
        << system.status();
    EXPECT_EQ(os.open(), open_before) << "call " << n;
    EXPECT_TRUE(System::Create(Small("sim://?devices=2")).ok()) << "call " << n;
  }
}

}  // namespace
}  // namespace tpushim
