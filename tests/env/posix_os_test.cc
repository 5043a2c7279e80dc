// Tests of the real OS layer against the running kernel.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::tpushim::testutil::TempDir;

TEST(PosixOsTest, MapAdviseLockAndUnmap) {
  Os* os = Os::Default();
  const size_t len = 16 * os->PageSize();
  absl::StatusOr<void*> p = os->Mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(os->Madvise(*p, len, MADV_WILLNEED).ok());
  ASSERT_TRUE(os->Mlock(*p, os->PageSize(), Os::LockWhen::kNow).ok());
  ASSERT_TRUE(os->Munlock(*p, os->PageSize()).ok());
  // Locked as the pages are touched.
  ASSERT_TRUE(os->Mlock(*p, len, Os::LockWhen::kOnFault).ok());
  std::memset(*p, 0xab, len);
  ASSERT_TRUE(os->Munlock(*p, len).ok());
  ASSERT_TRUE(os->Munmap(*p, len).ok());
}

TEST(PosixOsTest, MmapFailureIsAStatusNamingTheCall) {
  absl::StatusOr<void*> p = Os::Default()->Mmap(
      nullptr, 0, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()), ::testing::HasSubstr("mmap("));
}

TEST(PosixOsTest, UnknownAdviceIsInvalidArgument) {
  Os* os = Os::Default();
  const size_t len = os->PageSize();
  absl::StatusOr<void*> p = os->Mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(os->Madvise(*p, len, 12345).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(os->Munmap(*p, len).ok());
}

TEST(PosixOsTest, PinRangeCoversAnUnalignedRange) {
  Os* os = Os::Default();
  std::string buffer(3 * os->PageSize() + 17, 'x');
  ASSERT_TRUE(os->PinRange(buffer.data() + 5, buffer.size() - 5).ok());
  ASSERT_TRUE(os->UnpinRange(buffer.data() + 5, buffer.size() - 5).ok());
}

TEST(PosixOsTest, ProcessFacts) {
  Os* os = Os::Default();
  EXPECT_EQ(os->ProcessId(), getpid());
  EXPECT_EQ(os->ThreadId(), static_cast<pid_t>(syscall(SYS_gettid)));
  EXPECT_EQ(os->EffectiveUid(), geteuid());
  EXPECT_FALSE(os->UserName().empty());
  EXPECT_FALSE(os->HostName().empty());
  EXPECT_EQ(os->HostName().find('.'), std::string::npos);
  EXPECT_GE(os->OnlineCpuCount(), 1);
  EXPECT_GE(os->NumaNodeCount(), 1);
  EXPECT_GE(os->NumaNodeOfCurrentCpu(), 0);
  EXPECT_EQ(os->PageSize() % 4096, 0u);
  absl::StatusOr<Os::NumaNodeMemory> node0 = os->NumaMemoryOfNode(0);
  ASSERT_TRUE(node0.ok()) << node0.status();
  EXPECT_GT(node0->total_bytes, 0u);
  EXPECT_LE(node0->free_bytes, node0->total_bytes);
  EXPECT_FALSE(os->NumaMemoryOfNode(4096).ok());
  absl::StatusOr<ResourceLimit> memlock = os->GetMemlockLimit();
  ASSERT_TRUE(memlock.ok());
  EXPECT_LE(memlock->soft, memlock->hard);
}

TEST(PosixOsTest, ClocksMoveForward) {
  Os* os = Os::Default();
  const int64_t a = os->MonotonicNanos();
  const int64_t b = os->MonotonicNanos();
  EXPECT_LE(a, b);
  EXPECT_GT(os->Now(), absl::FromUnixSeconds(1'700'000'000));
}

TEST(PosixOsTest, ProcessExistsSeesSelfAndNotAReapedChild) {
  Os* os = Os::Default();
  EXPECT_TRUE(os->ProcessExists(getpid()));
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_FALSE(os->ProcessExists(child));
}

TEST(PosixOsTest, GetEnvDistinguishesUnsetFromEmpty) {
  Os* os = Os::Default();
  EXPECT_FALSE(os->GetEnv("TPUSHIM_TEST_SURELY_UNSET_VARIABLE").has_value());
  const std::optional<std::string> path = os->GetEnv("PATH");
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->empty());
}

TEST(PosixOsTest, ReadFileReadsProcFiles) {
  absl::StatusOr<std::string> status =
      Os::Default()->ReadFile("/proc/self/status");
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(absl::StrContains(*status, "CapEff:"));
  EXPECT_EQ(Os::Default()->ReadFile("/nonexistent/file").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(PosixOsTest, CreateLogFileIsExclusiveAndRefusesSymlinks) {
  Os* os = Os::Default();
  TempDir dir;
  const std::string path = dir.path() + "/log";
  absl::StatusOr<int> fd = os->CreateLogFile(path);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_TRUE(os->WriteAll(*fd, "hello\n", 6).ok());
  ASSERT_TRUE(os->Close(*fd).ok());
  EXPECT_EQ(os->CreateLogFile(path).status().code(),
            absl::StatusCode::kAlreadyExists);

  // A symlink planted at the name is never followed.
  const std::string victim = dir.path() + "/victim";
  const std::string link = dir.path() + "/planted";
  ASSERT_TRUE(os->Symlink(victim, link).ok());
  EXPECT_FALSE(os->CreateLogFile(link).ok());
  EXPECT_EQ(os->Lstat(victim).status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<FileInfo> info = os->Lstat(link);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->type, FileInfo::Type::kSymlink);
  info = os->Stat(path);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->type, FileInfo::Type::kRegular);
  EXPECT_EQ(info->size, 6u);
  EXPECT_EQ(info->owner, geteuid());
  EXPECT_EQ(os->ReadFile(path).value(), "hello\n");
}

TEST(PosixOsTest, DirectoryOperations) {
  Os* os = Os::Default();
  TempDir dir;
  const std::string sub = dir.path() + "/sub";
  ASSERT_TRUE(os->MakeDirectory(sub, 0700).ok());
  EXPECT_EQ(os->MakeDirectory(sub, 0700).code(),
            absl::StatusCode::kAlreadyExists);
  absl::StatusOr<FileInfo> info = os->Stat(sub);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->type, FileInfo::Type::kDirectory);
  EXPECT_EQ(info->mode & 0777, 0700u);
  EXPECT_TRUE(os->Access(sub, W_OK | X_OK).ok());
  ASSERT_EQ(rmdir(sub.c_str()), 0);

  const std::string a = dir.path() + "/a";
  absl::StatusOr<int> fd = os->CreateLogFile(a);
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(os->Close(*fd).ok());
  ASSERT_TRUE(os->Symlink("a", dir.path() + "/tmp_link").ok());
  ASSERT_TRUE(os->Rename(dir.path() + "/tmp_link", dir.path() + "/link").ok());
  absl::StatusOr<std::vector<std::string>> names =
      os->ListDirectory(dir.path());
  ASSERT_TRUE(names.ok());
  std::sort(names->begin(), names->end());
  EXPECT_EQ(*names, (std::vector<std::string>{"a", "link"}));
  ASSERT_TRUE(os->Unlink(dir.path() + "/link").ok());
  EXPECT_EQ(os->Unlink(dir.path() + "/link").code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(os->ListDirectory(dir.path() + "/missing").ok());
}

TEST(PosixOsTest, PositionedReadsAndWritesMoveExactlyTheirBytes) {
  Os* os = Os::Default();
  TempDir dir;
  absl::StatusOr<int> fd = os->CreateOutputFile(dir.Join("data"));
  ASSERT_TRUE(fd.ok()) << fd.status();
  const std::string text = "0123456789";
  ASSERT_TRUE(os->PwriteAll(*fd, text.data(), text.size(), 100).ok());
  ASSERT_TRUE(os->Close(*fd).ok());
  absl::StatusOr<int> rd = os->OpenDevice(dir.Join("data"), O_RDONLY);
  ASSERT_TRUE(rd.ok()) << rd.status();
  char back[4] = {};
  ASSERT_TRUE(os->PreadAll(*rd, back, sizeof(back), 103).ok());
  EXPECT_EQ(std::string(back, 4), "3456");
  // Past the end: OUT_OF_RANGE naming the call.
  const absl::Status end = os->PreadAll(*rd, back, sizeof(back), 108);
  EXPECT_EQ(end.code(), absl::StatusCode::kOutOfRange) << end;
  EXPECT_THAT(std::string(end.message()), HasSubstr("pread(4 bytes at 108)"));
  // Writing a read-only descriptor is EBADF's status, naming the call.
  const absl::Status bad = os->PwriteAll(*rd, text.data(), 1, 0);
  EXPECT_EQ(bad.code(), absl::ErrnoToStatusCode(EBADF)) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("pwrite(1 bytes at 0)"));
  EXPECT_TRUE(os->Close(*rd).ok());
}

TEST(PosixOsTest, EventFdsSignalDrainAndWake) {
  Os* os = Os::Default();
  absl::StatusOr<int> a = os->CreateEventFd();
  absl::StatusOr<int> b = os->CreateEventFd();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*os->WaitReadable({*a, *b}, 0), -1);  // nothing signalled
  ASSERT_TRUE(os->SignalEventFd(*b).ok());
  ASSERT_TRUE(os->SignalEventFd(*b).ok());
  EXPECT_EQ(*os->WaitReadable({*a, *b}, 1000), 1);
  EXPECT_EQ(*os->DrainEventFd(*b), 2u);
  EXPECT_EQ(*os->DrainEventFd(*b), 0u);  // drained, and non-blocking
  EXPECT_EQ(*os->WaitReadable({*a, *b}, 0), -1);
  EXPECT_TRUE(os->Close(*a).ok());
  EXPECT_TRUE(os->Close(*b).ok());
}

TEST(PosixOsTest, ReadLinkAndFailingIoctlsNameTheirCall) {
  Os* os = Os::Default();
  TempDir dir;
  ASSERT_TRUE(os->Symlink("../some/target", dir.Join("link")).ok());
  absl::StatusOr<std::string> target = os->ReadLink(dir.Join("link"));
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(*target, "../some/target");
  EXPECT_EQ(os->ReadLink(dir.Join("missing")).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<int> fd = os->CreateEventFd();
  ASSERT_TRUE(fd.ok());
  // An eventfd answers no VFIO request.
  const absl::StatusOr<int> r =
      os->Ioctl(*fd, 0x3b64, nullptr, "VFIO_GET_API_VERSION");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("ioctl(VFIO_GET_API_VERSION)"));
  EXPECT_TRUE(os->Close(*fd).ok());
}

}  // namespace
}  // namespace tpushim
