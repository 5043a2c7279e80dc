// Buffers of the memory kinds keep the order of the operations issued on
// them, host memories too: a copy out of a pinned_host or unpinned_host
// buffer issued right after the copy that fills it waits for that copy,
// with no `wait_for`; and the same through the System's transfer calls on
// a device buffer. The filling copies are held by a caller event (a
// "gate"), so that without the order the copies out would read zeros.

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "driver/system_internal.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"
#include "tpushim/memory.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr absl::Duration kHang = absl::Seconds(60);
constexpr absl::Duration kHeld = absl::Milliseconds(30);

absl::Status Within(const Event& e) {
  std::optional<absl::Status> s = e.AwaitWithTimeout(kHang);
  if (!s.has_value()) return absl::DeadlineExceededError("hung");
  return *s;
}

std::vector<char> Pattern(uint64_t n, int seed) {
  std::vector<char> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 7 + seed);
  return v;
}

class MemoryOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    OptionOverrides o;
    o.premapped_buffer_size = 8 * kMiB;
    o.device = "sim://?devices=2&hbm=32M";
    o.prefault_threads = 1;
    auto s = SystemFactory::Create(o, &os_);
    ASSERT_TRUE(s.ok()) << s.status();
    system_ = *std::move(s);
  }
  int pinned() const {
    return system_->memory_of_kind(MemoryKind::kPinnedHost);
  }
  int unpinned() const {
    return system_->memory_of_kind(MemoryKind::kUnpinnedHost);
  }
  // A device buffer of device 0 holding `bytes`.
  MemoryBuffer OnDevice(const std::vector<char>& bytes) {
    absl::StatusOr<MemoryCopy> made = system_->CreateMemoryBuffer(
        bytes.data(), bytes.size(), /*memory=*/0,
        HostBufferSemantics::kImmutableOnlyDuringCall);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return MemoryBuffer();
    EXPECT_TRUE(Within(made->event).ok());
    return made->buffer;
  }
  std::vector<char> Read(const MemoryBuffer& device_buffer, uint64_t n) {
    std::vector<char> out(n);
    absl::StatusOr<Event> down = system_->TransferFromDevice(
        device_buffer.device_buffer(), 0, out.data(), n);
    EXPECT_TRUE(down.ok()) << down.status();
    if (down.ok()) {
      EXPECT_TRUE(Within(*down).ok());
    }
    return out;
  }

  testutil::ScopedTestLogging logs_;
  FixedEnvironmentOs os_{Os::Default()};
  std::unique_ptr<System> system_;
};

TEST_F(MemoryOrderTest, ACopyOutOfAHostBufferWaitsForTheCopyThatFillsIt) {
  const uint64_t n = 64 * kKiB;
  const std::vector<char> bytes = Pattern(n, 1);
  for (const int memory : {pinned(), unpinned()}) {
    SCOPED_TRACE(MemoryKindName(system_->memories()[memory].kind));
    MemoryBuffer source = OnDevice(bytes);
    ASSERT_TRUE(source.valid());
    absl::StatusOr<CallerEvent> gate = system_->CreateEvent();
    ASSERT_TRUE(gate.ok());
    // device → host, held; then out of the host buffer, to a device and
    // to the other host memory, with no event between.
    absl::StatusOr<MemoryCopy> host =
        system_->CopyToMemory(source, memory, {gate->event()});
    ASSERT_TRUE(host.ok()) << host.status();
    const int other_host = memory == pinned() ? unpinned() : pinned();
    absl::StatusOr<MemoryCopy> back = system_->CopyToMemory(host->buffer, 1);
    absl::StatusOr<MemoryCopy> across =
        system_->CopyToMemory(host->buffer, other_host);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_TRUE(across.ok()) << across.status();
    EXPECT_FALSE(back->event.AwaitWithTimeout(kHeld).has_value())
        << "the copy out ran before the copy that fills the buffer";
    EXPECT_FALSE(across->event.IsReady());
    // Its ready event is the filling copy's.
    absl::StatusOr<Event> ready = system_->BufferReadyEvent(host->buffer);
    ASSERT_TRUE(ready.ok());
    EXPECT_FALSE(ready->IsReady());
    ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
    ASSERT_TRUE(Within(back->event).ok());
    ASSERT_TRUE(Within(across->event).ok());
    EXPECT_TRUE(Within(*ready).ok());
    EXPECT_EQ(Read(back->buffer, n), bytes);
    EXPECT_EQ(std::memcmp(across->buffer.data(), bytes.data(), n), 0);
    for (const MemoryBuffer& b :
         {source, host->buffer, back->buffer, across->buffer}) {
      absl::StatusOr<Event> freed = system_->Free(b);
      ASSERT_TRUE(freed.ok());
      EXPECT_TRUE(Within(*freed).ok());
    }
  }
}

TEST_F(MemoryOrderTest, AHostBufferWhoseFillingCopyFailedSaysSoWhenAskedReady) {
  const uint64_t n = 16 * kKiB;
  MemoryBuffer source = OnDevice(Pattern(n, 2));
  ASSERT_TRUE(source.valid());
  absl::StatusOr<CallerEvent> gate = system_->CreateEvent();
  ASSERT_TRUE(gate.ok());
  absl::StatusOr<MemoryCopy> host =
      system_->CopyToMemory(source, pinned(), {gate->event()});
  ASSERT_TRUE(host.ok());
  absl::StatusOr<MemoryCopy> back = system_->CopyToMemory(host->buffer, 0);
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(gate->Set(absl::DataLossError("the producer failed")).ok());
  EXPECT_EQ(Within(host->event).code(), absl::StatusCode::kDataLoss);
  // The copy out waited for the failed one's end; it does not take on its
  // failure (the order is not a dependency): the buffer's ready event
  // says the bytes are not what was meant.
  EXPECT_TRUE(Within(back->event).ok());
  absl::StatusOr<Event> ready = system_->BufferReadyEvent(host->buffer);
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(Within(*ready).code(), absl::StatusCode::kDataLoss);
}

TEST_F(MemoryOrderTest, SystemTransfersOfOneDeviceBufferRunInIssueOrder) {
  const uint64_t n = 256 * kKiB;
  const std::vector<char> first = Pattern(n, 3);
  const std::vector<char> second = Pattern(n, 4);
  MemoryBuffer b = OnDevice(first);
  ASSERT_TRUE(b.valid());
  absl::StatusOr<CallerEvent> gate = system_->CreateEvent();
  ASSERT_TRUE(gate.ok());
  std::vector<char> got(n);
  absl::StatusOr<Event> write = system_->TransferToDevice(
      second.data(), b.device_buffer(), 0, n, {gate->event()},
      HostBufferSemantics::kImmutableUntilTransferCompletes);
  ASSERT_TRUE(write.ok());
  absl::StatusOr<Event> read =
      system_->TransferFromDevice(b.device_buffer(), 0, got.data(), n);
  ASSERT_TRUE(read.ok());
  EXPECT_FALSE(read->AwaitWithTimeout(kHeld).has_value());
  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  ASSERT_TRUE(Within(*read).ok());
  EXPECT_EQ(got, second);
}

}  // namespace
}  // namespace tpushim
