// fork() with a System alive, as an input pipeline's workers do: the
// parent's pinned memory is not shared with the child (no copy-on-write,
// no copy of pinned pages), the child cannot use what it inherited and
// gets a named error (or SIGSEGV for raw memory) instead of a hang, and
// forks in the middle of transfers change nothing for the parent.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "driver/system_internal.h"
#include "env/fork_guard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fork_child.h"
#include "tests/testing/scoped_test_logging.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::ForkChild;
using testutil::RunForkedChild;
using testutil::ScopedTestLogging;
using testutil::WaitForChild;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;

OptionOverrides Options(uint64_t region) {
  OptionOverrides o;
  o.premapped_buffer_size = region;
  o.device = "sim://?devices=2&hbm=64M";
  o.prefault_threads = 1;
  return o;
}

// A field of /proc/<pid>/status in kB ("VmRSS"), -1 when absent.
int64_t StatusKb(const std::string& pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, field + ":")) continue;
    std::istringstream fields(line.substr(field.size() + 1));
    int64_t kb = -1;
    fields >> kb;
    return kb;
  }
  return -1;
}

// The physical frame of the page at `p` (0 when the kernel hides frames
// from this process, or the page is not present).
uint64_t FrameOf(const void* p) {
  const int fd = open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0) return 0;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t entry = 0;
  const off_t at =
      static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / page * 8);
  const ssize_t n = pread(fd, &entry, sizeof entry, at);
  close(fd);
  if (n != sizeof entry || (entry >> 63) == 0) return 0;
  return entry & ((uint64_t{1} << 55) - 1);
}

// Host → device → host of `n` bytes from `src`; true when they all came
// back.
bool RoundTrip(System& system, const char* src, uint64_t n, int device) {
  absl::StatusOr<DeviceBuffer> b = system.AllocateDevice(device, n);
  if (!b.ok()) return false;
  std::vector<char> back(n, 0);
  absl::StatusOr<Event> up = system.TransferToDevice(src, *b, 0, n);
  absl::StatusOr<Event> down =
      up.ok() ? system.TransferFromDevice(*b, 0, back.data(), n, {*up}) : up;
  const bool ok =
      down.ok() && down->Await().ok() && std::memcmp(back.data(), src, n) == 0;
  absl::StatusOr<Event> freed = system.Deallocate(*b);
  return ok && freed.ok() && freed->Await().ok();
}

TEST(ForkTest, ParentWritesDoNotCopyPagesWhileAChildLives) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  auto system = SystemFactory::Create(Options(64 * kMiB), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  absl::StatusOr<PinnedHostBuffer> buf =
      (*system)->AllocatePinnedHost(32 * kMiB);
  ASSERT_TRUE(buf.ok()) << buf.status();
  char* const p = static_cast<char*>(buf->data());
  std::memset(p, 1, buf->size());
  std::vector<uint64_t> frames;
  for (uint64_t off = 0; off < buf->size(); off += 4 * kMiB) {
    frames.push_back(FrameOf(p + off));
  }
  const int64_t locked_before = StatusKb("self", "VmLck");

  int ready[2], release[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(release), 0);
  const pid_t child = ForkChild([&] {
    char c = 1;
    (void)!write(ready[1], &c, 1);
    (void)!read(release[0], &c, 1);  // lives until the parent is done
    return 0;
  });
  ASSERT_GT(child, 0);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);

  // The child has none of the region: its resident set is far below the
  // parent's, which holds all of it.
  const int64_t child_rss = StatusKb(std::to_string(child), "VmRSS");
  const int64_t parent_rss = StatusKb("self", "VmRSS");
  EXPECT_GT(parent_rss - child_rss, static_cast<int64_t>(48 * kMiB / 1024))
      << "child VmRSS " << child_rss << " kB, parent " << parent_rss << " kB";

  // Writing every page: no copy-on-write, the same frames as before.
  std::memset(p, 2, buf->size());
  if (frames.front() != 0) {
    size_t i = 0;
    for (uint64_t off = 0; off < buf->size(); off += 4 * kMiB, ++i) {
      EXPECT_EQ(FrameOf(p + off), frames[i]) << "page at offset " << off;
    }
  } else {
    std::cout << "(physical frames are hidden from this process: the "
                 "copy-on-write check is the resident-set one alone)\n";
  }
  // Locks unchanged, and the region still moves data without a copy.
  EXPECT_EQ(StatusKb("self", "VmLck"), locked_before);
  EXPECT_EQ((*system)->PathFor(p, 8 * kMiB), TransferPath::kZeroCopy);
  EXPECT_TRUE(RoundTrip(**system, p, 8 * kMiB, 0));

  ASSERT_EQ(write(release[1], "x", 1), 1);
  EXPECT_TRUE(WaitForChild(child).Exited(0));
  for (int fd : {ready[0], ready[1], release[0], release[1]}) close(fd);
}

TEST(ForkTest, ChildTouchingAnInheritedPinnedBufferGetsSigsegv) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  auto system = SystemFactory::Create(Options(8 * kMiB), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  absl::StatusOr<PinnedHostBuffer> buf = (*system)->AllocatePinnedHost(kMiB);
  ASSERT_TRUE(buf.ok()) << buf.status();
  char* const p = static_cast<char*>(buf->data());
  std::memset(p, 7, kMiB);
  const auto r = RunForkedChild([p] {
    // The kernel's verdict, not a sanitizer's SEGV handler's.
    signal(SIGSEGV, SIG_DFL);
    p[100] = 1;  // the parent's pinned memory: not in the child
    return 0;
  });
  EXPECT_TRUE(r.KilledBy(SIGSEGV)) << r.Describe();
  EXPECT_EQ(p[100], 7);
}

TEST(ForkTest, InheritedSystemRefusesCallsAndIsAbandoned) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  auto created = SystemFactory::Create(Options(8 * kMiB), &os);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<System> system = *std::move(created);
  absl::StatusOr<PinnedHostBuffer> pinned = system->AllocatePinnedHost(kMiB);
  ASSERT_TRUE(pinned.ok());
  absl::StatusOr<DeviceBuffer> dev = system->AllocateDevice(0, kMiB);
  ASSERT_TRUE(dev.ok());
  std::vector<char> host(64 * kKiB, 3);
  const SystemStats before = system->GetStats();

  const auto r = RunForkedChild([&] {
    const auto refused = [](const absl::Status& s) {
      return s.code() == absl::StatusCode::kFailedPrecondition &&
             absl::StrContains(s.message(), "fork() child") &&
             absl::StrContains(s.message(), "create a System in the child");
    };
    if (!refused(system->AllocateDevice(0, kMiB).status())) return 1;
    if (!refused(system->AllocatePinnedHost(4096).status())) return 2;
    if (!refused(system->TransferToDevice(host.data(), *dev, 0, host.size())
                     .status())) {
      return 3;
    }
    if (!refused(system->Deallocate(*dev).status())) return 4;
    if (!refused(system->AwaitPremapped())) return 5;
    if (system->GetStats().devices.size() != 0) return 6;
    // Letting go of everything inherited neither hangs nor crashes.
    *pinned = PinnedHostBuffer();
    *dev = DeviceBuffer();
    system.reset();
    return 0;
  });
  EXPECT_TRUE(r.Exited(0)) << r.Describe();

  // The parent's system is as it was, and works.
  const SystemStats after = system->GetStats();
  EXPECT_EQ(after.region.live_allocations, before.region.live_allocations);
  EXPECT_EQ(after.transfers.device_buffers_live,
            before.transfers.device_buffers_live);
  EXPECT_TRUE(RoundTrip(*system, host.data(), host.size(), 1));
}

TEST(ForkTest, ForksInTheMiddleOfTransfersChangeNothingForTheParent) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  OptionOverrides o = Options(16 * kMiB);
  o.premapped_buffer_transfer_threshold_bytes = kMiB;
  auto system = SystemFactory::Create(o, &os);
  ASSERT_TRUE(system.ok()) << system.status();
  absl::StatusOr<PinnedHostBuffer> pinned = (*system)->AllocatePinnedHost(kMiB);
  ASSERT_TRUE(pinned.ok());
  std::memset(pinned->data(), 9, pinned->size());

  // Two threads move data on every path (zero-copy, staged, pinned) and
  // check every byte, while the main thread forks children that try the
  // inherited system and exit.
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, rounds{0};
  std::vector<std::thread> movers;
  for (int t = 0; t < 2; ++t) {
    movers.emplace_back([&, t] {
      std::vector<char> staged(256 * kKiB), large(3 * kMiB);
      for (size_t i = 0; i < staged.size(); ++i) staged[i] = char(i * 7 + t);
      for (size_t i = 0; i < large.size(); ++i) large[i] = char(i * 13 + t);
      while (!stop.load()) {
        if (!RoundTrip(**system, staged.data(), staged.size(), t) ||
            !RoundTrip(**system, large.data(), large.size(), t) ||
            !RoundTrip(**system, static_cast<char*>(pinned->data()),
                       pinned->size(), t)) {
          bad.fetch_add(1);
        }
        rounds.fetch_add(1);
      }
    });
  }
  constexpr int kForks = 20;
  int children_ok = 0;
  for (int i = 0; i < kForks; ++i) {
    while (rounds.load() < i) std::this_thread::yield();
    const pid_t child = ForkChild([&] {
      absl::StatusOr<DeviceBuffer> b = (*system)->AllocateDevice(0, 4096);
      return b.status().code() == absl::StatusCode::kFailedPrecondition ? 0 : 1;
    });
    ASSERT_GT(child, 0);
    if (WaitForChild(child).Exited(0)) ++children_ok;
  }
  stop.store(true);
  for (std::thread& t : movers) t.join();
  EXPECT_EQ(children_ok, kForks);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GE(rounds.load(), kForks);
  const SystemStats s = (*system)->GetStats();
  for (int d = 0; d < 2; ++d) {
    for (int p = 0; p < kTransferPathCount; ++p) {
      EXPECT_EQ(s.transfers.host[d][p].failed, 0u);
    }
  }
}

}  // namespace
}  // namespace tpushim
