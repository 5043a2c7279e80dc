// Pinning caller memory through io_uring's registered buffers
// (env/posix/io_uring_pins.h), and PosixOs's PinRange/UnpinRange over it:
// the kernel counts the pages pinned (VmPin) while they are and not after,
// slots are reused, running out of slots is UNAVAILABLE, and memory
// io_uring will not pin is locked with mlock (VmLck) instead.

#include "env/posix/io_uring_pins.h"

#include <sys/mman.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
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
    pins_ = IoUringPins::Open(&why);
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
  if (IoUringPins::Open(nullptr) == nullptr) {
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
