// Pinning caller memory through io_uring's registered buffers
// (env/posix/io_uring_pins.h), and PosixOs's PinRange/UnpinRange over it:
// the kernel counts the pages pinned (VmPin) while they are and not after,
// slots are reused, running out of slots is UNAVAILABLE, and memory
// io_uring will not pin is locked with mlock (VmLck) instead. The probe
// in Open accepts any rise of VmPin of at least a page that goes again
// (read through an Os, faked here), and a failed unpin is retried.

#include "env/posix/io_uring_pins.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * kKiB;

// A field of /proc/self/status in KiB ("VmPin", "VmLck").
uint64_t StatusKiB(const std::string& field) {
  absl::StatusOr<std::string> status =
      Os::Default()->ReadFile("/proc/self/status");
  if (!status.ok()) return 0;
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (!absl::ConsumePrefix(&line, field + ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, " kB");
    uint64_t kib = 0;
    if (absl::SimpleAtoi(line, &kib)) return kib;
  }
  return 0;
}

struct Buffer {
  explicit Buffer(uint64_t n)
      : data(static_cast<char*>(std::aligned_alloc(4096, n))), size(n) {
    for (uint64_t i = 0; i < n; i += 4096) data[i] = 1;
  }
  ~Buffer() { std::free(data); }
  char* data;
  uint64_t size;
};

class IoUringPinsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    pins_ = IoUringPins::Open(Os::Default(), &why);
    if (pins_ == nullptr) {
      GTEST_SKIP() << "io_uring cannot pin here (" << why
                   << "); PosixOs pins with mlock, which os_test covers";
    }
  }
  std::unique_ptr<IoUringPins> pins_;
};

TEST_F(IoUringPinsTest, PinnedPagesAreCountedWhilePinned) {
  Buffer b(4 * kMiB);
  const uint64_t before = StatusKiB("VmPin");
  absl::StatusOr<uint32_t> slot = pins_->Pin(b.data, b.size);
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(StatusKiB("VmPin") - before, 4 * kMiB / kKiB);
  ASSERT_TRUE(pins_->Unpin(*slot).ok());
  EXPECT_EQ(StatusKiB("VmPin"), before);
}

TEST_F(IoUringPinsTest, AnUnalignedRangePinsItsPages) {
  Buffer b(64 * kKiB);
  const uint64_t before = StatusKiB("VmPin");
  // 100 bytes from 4000: two pages.
  absl::StatusOr<uint32_t> slot = pins_->Pin(b.data + 4000, 100);
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(StatusKiB("VmPin") - before, 8u);
  ASSERT_TRUE(pins_->Unpin(*slot).ok());
  EXPECT_EQ(StatusKiB("VmPin"), before);
}

TEST_F(IoUringPinsTest, SlotsAreReusedAndRunningOutIsUnavailable) {
  Buffer b(64 * kKiB);
  for (int i = 0; i < 3 * static_cast<int>(IoUringPins::kSlots); ++i) {
    absl::StatusOr<uint32_t> slot = pins_->Pin(b.data, 4096);
    ASSERT_TRUE(slot.ok()) << i << ": " << slot.status();
    ASSERT_TRUE(pins_->Unpin(*slot).ok());
  }
  std::vector<uint32_t> held;
  for (uint32_t i = 0; i < IoUringPins::kSlots; ++i) {
    absl::StatusOr<uint32_t> slot = pins_->Pin(b.data + (i % 16) * 4096, 1);
    ASSERT_TRUE(slot.ok()) << i << ": " << slot.status();
    held.push_back(*slot);
  }
  absl::StatusOr<uint32_t> more = pins_->Pin(b.data, 1);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(more.status().message(), ::testing::HasSubstr("slots"));
  for (uint32_t s : held) ASSERT_TRUE(pins_->Unpin(s).ok());
  ASSERT_TRUE(pins_->Pin(b.data, 1).ok());
}

TEST_F(IoUringPinsTest, ClosingUnpinsWhatIsStillPinned) {
  Buffer b(2 * kMiB);
  const uint64_t before = StatusKiB("VmPin");
  ASSERT_TRUE(pins_->Pin(b.data, b.size).ok());
  EXPECT_GT(StatusKiB("VmPin"), before);
  pins_.reset();
  EXPECT_EQ(StatusKiB("VmPin"), before);
}

// An Os whose /proc/self/status says VmPin is each of `kib` in turn, over
// and over (the probe reads it before, during and after its pin).
class VmPinOs : public OsWrapper {
 public:
  explicit VmPinOs(std::vector<int64_t> kib)
      : OsWrapper(Os::Default()), kib_(std::move(kib)) {}
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    if (path != "/proc/self/status") return OsWrapper::ReadFile(path);
    const int64_t v = kib_[reads_++ % kib_.size()];
    return absl::StrCat("Name:\tio_uring_pins_test\nVmLck:\t       0 kB\n",
                        "VmPin:\t", v, " kB\nVmHWM:\t  1000 kB\n");
  }
  size_t reads() const { return reads_; }

 private:
  std::vector<int64_t> kib_;
  size_t reads_ = 0;
};

void SkipWithoutIoUring() {
  std::string why;
  if (IoUringPins::Open(Os::Default(), &why) == nullptr) {
    GTEST_SKIP() << "io_uring cannot pin here (" << why << ")";
  }
}

// A probe page counted as a whole transparent huge page (2 MiB) or a
// 64 KiB page, or beside another pin of the process: the long-term pin
// is usable all the same.
TEST(IoUringPinsProbeTest, AcceptsAnyRiseOfAtLeastAPageThatGoesAgain) {
  SkipWithoutIoUring();
  if (IsSkipped()) return;
  for (const std::vector<int64_t>& seen :
       {std::vector<int64_t>{100, 100 + 2048, 100},
        std::vector<int64_t>{100, 100 + 64, 100},
        std::vector<int64_t>{100, 100 + 4 + 512, 100 + 512}}) {
    VmPinOs os(seen);
    std::string why;
    EXPECT_NE(IoUringPins::Open(&os, &why), nullptr)
        << seen[0] << ", " << seen[1] << ", " << seen[2] << ": " << why;
    EXPECT_EQ(os.reads(), 3u);
  }
}

// Pages that stay counted after the unpin (kernels that release them late)
// or a pin that is not counted at all: off, and `why` says what was seen.
TEST(IoUringPinsProbeTest, RefusesPinsThatAreNotCountedOrStay) {
  SkipWithoutIoUring();
  if (IsSkipped()) return;
  for (const std::vector<int64_t>& seen :
       {std::vector<int64_t>{100, 104, 104},
        std::vector<int64_t>{100, 100, 100},
        std::vector<int64_t>{100, 102, 98}}) {
    VmPinOs os(seen);
    std::string why;
    EXPECT_EQ(IoUringPins::Open(&os, &why), nullptr) << seen[1];
    EXPECT_THAT(why, ::testing::HasSubstr(absl::StrCat(
                         "VmPin ", seen[0], " kB, ", seen[1], " kB")));
    EXPECT_THAT(why, ::testing::HasSubstr("late"));
    EXPECT_EQ(os.reads(), 9u) << "three tries";
  }
}

// An unpin the kernel refuses (ENOMEM) keeps the slot's pages pinned and
// the slot out of use, and a later call unpins it: nothing stays pinned
// for the life of the process.
TEST(IoUringPinsUnpinTest, AFailedUnpinIsRetriedByTheNextCall) {
  SkipWithoutIoUring();
  if (IsSkipped()) return;
  // Unpins of slot `failing` fail while `fail_unpins` lasts.
  std::atomic<int> fail_unpins{0};
  std::atomic<uint32_t> failing{IoUringPins::kSlots};
  std::unique_ptr<IoUringPins> pins =
      IoUringPins::Open(Os::Default(), nullptr, [&](uint32_t s) {
        return s == failing && fail_unpins.fetch_sub(1) > 0 ? ENOMEM : 0;
      });
  ASSERT_NE(pins, nullptr);
  Buffer a(kMiB);
  Buffer b(64 * kKiB);
  const uint64_t before = StatusKiB("VmPin");
  absl::StatusOr<uint32_t> slot = pins->Pin(a.data, a.size);
  ASSERT_TRUE(slot.ok()) << slot.status();
  failing = *slot;
  fail_unpins = 1;
  absl::Status unpinned = pins->Unpin(*slot);
  EXPECT_EQ(unpinned.code(), absl::StatusCode::kResourceExhausted) << unpinned;
  EXPECT_THAT(unpinned.message(), ::testing::HasSubstr("retries"));
  EXPECT_EQ(pins->pending_unpins(), 1u);
  EXPECT_EQ(StatusKiB("VmPin") - before, kMiB / kKiB) << "still pinned";

  // The next pin first lets the failed one go.
  absl::StatusOr<uint32_t> other = pins->Pin(b.data, b.size);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(pins->pending_unpins(), 0u);
  EXPECT_EQ(StatusKiB("VmPin") - before, b.size / kKiB);
  ASSERT_TRUE(pins->Unpin(*other).ok());
  EXPECT_EQ(StatusKiB("VmPin"), before);

  // A retry that fails again stays pending; an unpin retries it too.
  slot = pins->Pin(a.data, a.size);
  ASSERT_TRUE(slot.ok()) << slot.status();
  other = pins->Pin(b.data, b.size);
  ASSERT_TRUE(other.ok()) << other.status();
  failing = *slot;
  fail_unpins = 2;  // this unpin and the retry of the next call
  EXPECT_FALSE(pins->Unpin(*slot).ok());
  ASSERT_TRUE(pins->Unpin(*other).ok());
  EXPECT_EQ(pins->pending_unpins(), 1u);
  EXPECT_EQ(StatusKiB("VmPin") - before, kMiB / kKiB);
  slot = pins->Pin(b.data, 1);
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(pins->pending_unpins(), 0u);
  ASSERT_TRUE(pins->Unpin(*slot).ok());
  EXPECT_EQ(StatusKiB("VmPin"), before);
}

// PosixOs: pinned long-term where io_uring can, else locked; either way
// counted while pinned and released by the matching UnpinRange, also when
// two users pinned the same range.
TEST(PosixOsPinTest, PinRangeIsCountedAndReleasedPairwise) {
  Os* os = Os::Default();
  Buffer b(2 * kMiB);
  auto held = [] { return StatusKiB("VmPin") + StatusKiB("VmLck"); };
  const uint64_t before = held();
  ASSERT_TRUE(os->PinRange(b.data + 10, kMiB).ok());
  ASSERT_TRUE(os->PinRange(b.data + 10, kMiB).ok());
  EXPECT_GE(held() - before, kMiB / kKiB);
  ASSERT_TRUE(os->UnpinRange(b.data + 10, kMiB).ok());
  EXPECT_GE(held() - before, kMiB / kKiB) << "the second pin went too";
  ASSERT_TRUE(os->UnpinRange(b.data + 10, kMiB).ok());
  EXPECT_EQ(held(), before);
}

// Where io_uring can pin, PosixOs pins that way (VmPin), not with mlock.
TEST(PosixOsPinTest, PinRangeUsesTheLongTermPinWhereIoUringCan) {
  if (IoUringPins::Open(Os::Default(), nullptr) == nullptr) {
    GTEST_SKIP() << "io_uring cannot pin here";
  }
  Os* os = Os::Default();
  Buffer b(kMiB);
  const uint64_t pinned = StatusKiB("VmPin");
  const uint64_t locked = StatusKiB("VmLck");
  ASSERT_TRUE(os->PinRange(b.data, kMiB).ok());
  EXPECT_EQ(StatusKiB("VmPin") - pinned, kMiB / kKiB);
  EXPECT_EQ(StatusKiB("VmLck"), locked);
  ASSERT_TRUE(os->UnpinRange(b.data, kMiB).ok());
  EXPECT_EQ(StatusKiB("VmPin"), pinned);
}

// A file-backed mapping, which io_uring does not pin long-term on every
// kernel, is still pinned (locked, if need be).
TEST(PosixOsPinTest, FileBackedMemoryIsPinnedToo) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
    defined(TPUSHIM_SANITIZER_FAKES_MLOCK)
  GTEST_SKIP() << "the sanitizer runtimes' mlock() locks nothing (VmLck)";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "the sanitizer runtimes' mlock() locks nothing (VmLck)";
#endif
#endif
  Os* os = Os::Default();
  char path[] = "/var/tmp/tpushim_pin_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, kMiB), 0);
  void* p = mmap(nullptr, kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  const uint64_t before = StatusKiB("VmPin") + StatusKiB("VmLck");
  ASSERT_TRUE(os->PinRange(p, kMiB).ok());
  EXPECT_EQ(StatusKiB("VmPin") + StatusKiB("VmLck") - before, kMiB / kKiB);
  ASSERT_TRUE(os->UnpinRange(p, kMiB).ok());
  EXPECT_EQ(StatusKiB("VmPin") + StatusKiB("VmLck"), before);
  munmap(p, kMiB);
}

}  // namespace
}  // namespace tpushim
