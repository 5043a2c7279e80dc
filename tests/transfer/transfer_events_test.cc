// A host→device transfer's two events (ready and host_released) on each
// path, and events the caller makes and sets (CallerEvent): in wait_for
// lists, with callbacks, set twice, destroyed or shut down before set, and
// set from another thread while transfers wait (label concurrency).
//
// Where a test needs a transfer whose DMA is still running, the sim link
// is throttled to 0.001 Gb/s: a 512 KiB descriptor then takes seconds, and
// shutting the engine down delivers it at once. No assertion is about
// time, only about order.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::TransferRig;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
// A link so slow that a transfer's DMA outlasts any test step: no
// descriptor completes within 10 seconds of its submission, whatever its
// size (latency 10 s on top of the link time).
constexpr char kNoCompletionFor10s[] =
    "sim://?hbm=64M&link_gbps=0.001&latency_us=10000000";

std::unique_ptr<TransferRig> MakeRig(TransferRig::Params params) {
  absl::StatusOr<std::unique_ptr<TransferRig>> rig =
      TransferRig::Create(std::move(params));
  EXPECT_TRUE(rig.ok()) << rig.status();
  return rig.ok() ? *std::move(rig) : nullptr;
}

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 7 + seed);
  return v;
}

std::vector<char> ReadBack(TransferEngine& engine, const DeviceBuffer& b,
                           uint64_t n) {
  std::vector<char> out(n);
  absl::StatusOr<Event> down = engine.TransferFromDevice(b, 0, out.data(), n);
  EXPECT_TRUE(down.ok()) << down.status();
  if (down.ok()) {
    EXPECT_TRUE(down->Await().ok()) << down->Await();
  }
  return out;
}

// ---- ready and host_released -------------------------------------------

class StagedHostReleasedTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(StagedHostReleasedTest, ResolvesWhenTheBytesAreInStagingBeforeReady) {
  const uint64_t n = GetParam();
  TransferRig::Params params;
  params.region_bytes = 64 * kMiB;
  params.threshold = 16 * kMiB;  // everything here is staged
  params.device_url = kNoCompletionFor10s;
  // Room for the whole transfer in staging: the copier never waits for a
  // chunk's DMA, so host_released cannot depend on the link.
  params.engine.staging_depth = 16;
  params.engine.max_staging_bytes = 16 * kMiB;
  auto rig = MakeRig(params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::vector<char> src = Pattern(n, 3);
  ASSERT_EQ(engine.PathFor(src.data(), n), TransferPath::kStaged);
  absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, n);
  ASSERT_TRUE(dst.ok()) << dst.status();

  absl::StatusOr<TransferEvents> events =
      engine.TransferToDeviceWithEvents(src.data(), *dst, 0, n);
  ASSERT_TRUE(events.ok()) << events.status();
  // No DMA can complete within 10 s; the copy into staging does not wait
  // for one. Resolving host_released at the DMA's end makes this time out.
  std::optional<absl::Status> released =
      events->host_released.AwaitWithTimeout(absl::Seconds(10));
  ASSERT_TRUE(released.has_value())
      << "host_released waited for the DMA on the staged path";
  EXPECT_TRUE(released->ok()) << *released;
  EXPECT_FALSE(events->ready.IsReady());
  engine.Shutdown();  // delivers the modelled completions at once
  EXPECT_TRUE(events->ready.Await().ok()) << events->ready.Await();
}

INSTANTIATE_TEST_SUITE_P(Sizes, StagedHostReleasedTest,
                         ::testing::Values(256 * kKiB, 1 * kMiB, 8 * kMiB));

TEST(HostReleasedTest, StagedBytesReachTheDeviceAfterTheCallerReusesIt) {
  TransferRig::Params params;
  params.region_bytes = 16 * kMiB;
  params.threshold = 4 * kMiB;
  auto rig = MakeRig(params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 3 * kMiB + 5;
  std::vector<char> src = Pattern(n, 1);
  const std::vector<char> sent = src;
  absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, n);
  ASSERT_TRUE(dst.ok());
  absl::StatusOr<TransferEvents> events =
      engine.TransferToDeviceWithEvents(src.data(), *dst, 0, n);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_TRUE(events->host_released.Await().ok());
  std::memset(src.data(), 0, n);
  ASSERT_TRUE(events->ready.Await().ok());
  EXPECT_TRUE(ReadBack(engine, *dst, n) == sent);
}

TEST(HostReleasedTest, PinnedPathReleasesTheBufferWithReady) {
  TransferRig::Params params;
  params.region_bytes = 16 * kMiB;
  params.threshold = 64 * kKiB;  // 1 MiB goes pinned
  // 1 MiB takes half a second on this link: no DMA of it can end sooner.
  params.device_url = "sim://?hbm=64M&link_gbps=0.016";
  auto rig = MakeRig(params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 1 * kMiB;
  std::vector<char> src = Pattern(n, 2);
  ASSERT_EQ(engine.PathFor(src.data(), n), TransferPath::kPinned);
  absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, n);
  ASSERT_TRUE(dst.ok());
  absl::StatusOr<TransferEvents> events =
      engine.TransferToDeviceWithEvents(src.data(), *dst, 0, n);
  ASSERT_TRUE(events.ok()) << events.status();
  // The device reads the caller's pages until the DMA is done.
  EXPECT_FALSE(events->host_released.IsReady());
  ASSERT_TRUE(events->ready.Await().ok());
  EXPECT_TRUE(events->host_released.IsReady());
  EXPECT_TRUE(events->host_released.Await().ok());
}

TEST(HostReleasedTest, IsNeverLaterThanReady) {
  TransferRig::Params params;
  params.region_bytes = 16 * kMiB;
  params.threshold = 256 * kKiB;
  auto rig = MakeRig(params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  for (uint64_t n : {uint64_t{100}, 200 * kKiB, 2 * kMiB}) {
    SCOPED_TRACE(n);
    std::vector<char> src = Pattern(n, 4);
    absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, n);
    ASSERT_TRUE(dst.ok());
    for (HostBufferSemantics sem :
         {HostBufferSemantics::kImmutableOnlyDuringCall,
          HostBufferSemantics::kImmutableUntilTransferCompletes}) {
      absl::StatusOr<TransferEvents> events =
          engine.TransferToDeviceWithEvents(src.data(), *dst, 0, n, {}, sem);
      ASSERT_TRUE(events.ok());
      if (sem == HostBufferSemantics::kImmutableOnlyDuringCall) {
        // The call returned: the engine is done with the buffer.
        EXPECT_TRUE(events->host_released.IsReady());
      }
      ASSERT_TRUE(events->ready.Await().ok());
      EXPECT_TRUE(events->host_released.IsReady());
      EXPECT_TRUE(events->host_released.Await().ok());
    }
  }
}

TEST(HostReleasedTest, ADmaFailureAfterTheCopyFailsReadyOnly) {
  TransferRig::Params params;
  params.region_bytes = 16 * kMiB;
  params.faults = "dma:nth=1,code=UNAVAILABLE";
  auto rig = MakeRig(params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 64 * kKiB;
  std::vector<char> src = Pattern(n, 5);
  ASSERT_EQ(engine.PathFor(src.data(), n), TransferPath::kStaged);
  absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, n);
  ASSERT_TRUE(dst.ok());
  absl::StatusOr<TransferEvents> events =
      engine.TransferToDeviceWithEvents(src.data(), *dst, 0, n);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->ready.Await().code(), absl::StatusCode::kUnavailable);
  // Every byte had been copied out of the caller's buffer: it was free.
  EXPECT_TRUE(events->host_released.Await().ok());
}

TEST(HostReleasedTest, APinnedDmaFailureFailsBoth) {
  TransferRig::Params params;
  params.region_bytes = 16 * kMiB;
  params.threshold = 64 * kKiB;
  params.faults = "dma:nth=1,code=UNAVAILABLE";
  auto rig = MakeRig(params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 1 * kMiB;
  std::vector<char> src = Pattern(n, 6);
  absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, n);
  ASSERT_TRUE(dst.ok());
  absl::StatusOr<TransferEvents> events =
      engine.TransferToDeviceWithEvents(src.data(), *dst, 0, n);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->ready.Await().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(events->host_released.Await().code(),
            absl::StatusCode::kUnavailable);
}

TEST(HostReleasedTest, AFailedDependencyFailsBothWithItsStatus) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  std::vector<char> src = Pattern(4 * kKiB, 7);
  absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, src.size());
  ASSERT_TRUE(dst.ok());
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok()) << gate.status();
  absl::StatusOr<TransferEvents> events = engine.TransferToDeviceWithEvents(
      src.data(), *dst, 0, src.size(), {gate->event()});
  ASSERT_TRUE(events.ok());
  EXPECT_FALSE(events->host_released.IsReady());
  ASSERT_TRUE(gate->Set(absl::DataLossError("upstream broke")).ok());
  EXPECT_EQ(events->ready.Await(), absl::DataLossError("upstream broke"));
  EXPECT_EQ(events->host_released.Await(),
            absl::DataLossError("upstream broke"));
}

TEST(HostReleasedTest, ArrayTransfersHaveBothEvents) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> dst =
      engine.Allocate(0, DeviceBufferSpec{.shape = "f32[16,100]"});
  ASSERT_TRUE(dst.ok()) << dst.status();
  std::vector<char> src = Pattern(dst->host_size(), 8);
  absl::StatusOr<TransferEvents> events =
      engine.TransferArrayToDeviceWithEvents(src.data(), *dst);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_TRUE(events->ready.Await().ok());
  EXPECT_TRUE(events->host_released.Await().ok());
}

// ---- caller events -------------------------------------------------------

TEST(CallerEventTest, TransfersWaitForItAndRunOnceSet) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  EXPECT_FALSE(gate->event().IsReady());
  std::vector<char> src = Pattern(8 * kKiB, 9);
  absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, src.size());
  ASSERT_TRUE(dst.ok());
  absl::StatusOr<Event> up =
      engine.TransferToDevice(src.data(), *dst, 0, src.size(), {gate->event()});
  ASSERT_TRUE(up.ok());
  std::atomic<int> called{0};
  gate->event().AddCallback([&](absl::Status s) {
    EXPECT_TRUE(s.ok());
    called.fetch_add(1);
  });
  EXPECT_FALSE(up->IsReady());
  EXPECT_FALSE(
      gate->event().AwaitWithTimeout(absl::ZeroDuration()).has_value());
  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  EXPECT_TRUE(up->Await().ok());
  EXPECT_TRUE(gate->event().Await().ok());
  EXPECT_TRUE(ReadBack(engine, *dst, src.size()) == src);
  engine.Shutdown();  // runs the pending callbacks
  EXPECT_EQ(called.load(), 1);
}

TEST(CallerEventTest, SettingTwiceIsANamedErrorThatChangesNothing) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  absl::StatusOr<CallerEvent> e = rig->engine().CreateEvent();
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(e->Set(absl::AbortedError("first")).ok());
  absl::Status again = e->Set(absl::OkStatus());
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("already set"));
  EXPECT_EQ(e->event().Await(), absl::AbortedError("first"));
}

TEST(CallerEventTest, AFailedStatusFailsTheTransfersWaitingForIt) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  std::vector<char> host(4 * kKiB);
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, host.size());
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Event> down = engine.TransferFromDevice(
      *b, 0, host.data(), host.size(), {gate->event()});
  ASSERT_TRUE(down.ok());
  absl::StatusOr<Event> freed = engine.Deallocate(*b, {gate->event()});
  ASSERT_TRUE(freed.ok());
  ASSERT_TRUE(gate->Set(absl::InternalError("producer failed")).ok());
  EXPECT_EQ(down->Await(), absl::InternalError("producer failed"));
  EXPECT_EQ(freed->Await(), absl::InternalError("producer failed"));
}

TEST(CallerEventTest, DestroyedBeforeSetFailsItsWaitersWithCancelled) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  Event waiter_side;
  absl::StatusOr<Event> up;
  std::vector<char> src(4 * kKiB);
  absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, src.size());
  ASSERT_TRUE(dst.ok());
  {
    absl::StatusOr<CallerEvent> e = engine.CreateEvent();
    ASSERT_TRUE(e.ok());
    waiter_side = e->event();
    up = engine.TransferToDevice(src.data(), *dst, 0, src.size(), {e->event()});
    ASSERT_TRUE(up.ok());
  }
  absl::Status s = waiter_side.Await();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(s.message(), HasSubstr("destroyed before it was set"));
  EXPECT_EQ(up->Await().code(), absl::StatusCode::kCancelled);
}

TEST(CallerEventTest, MovedAndDefaultEventsHaveNothingToSet) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  absl::StatusOr<CallerEvent> e = rig->engine().CreateEvent();
  ASSERT_TRUE(e.ok());
  CallerEvent moved = std::move(*e);
  EXPECT_EQ(e->Set(absl::OkStatus()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(moved.event().IsReady());  // the move did not cancel it
  EXPECT_TRUE(moved.Set(absl::OkStatus()).ok());
  CallerEvent none;
  absl::Status s = none.Set(absl::OkStatus());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("refers to no event"));
}

TEST(CallerEventTest, ShutdownFailsUnsetEventsAndLaterSetsAreRefused) {
  auto rig = MakeRig({});
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<CallerEvent> e = engine.CreateEvent();
  ASSERT_TRUE(e.ok());
  std::vector<char> src(4 * kKiB);
  absl::StatusOr<DeviceBuffer> dst = engine.Allocate(0, src.size());
  ASSERT_TRUE(dst.ok());
  absl::StatusOr<Event> up =
      engine.TransferToDevice(src.data(), *dst, 0, src.size(), {e->event()});
  ASSERT_TRUE(up.ok());
  engine.Shutdown();
  EXPECT_EQ(e->event().Await().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(up->Await().code(), absl::StatusCode::kCancelled);
  absl::Status late = e->Set(absl::OkStatus());
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), HasSubstr("shut down"));
  EXPECT_EQ(engine.CreateEvent().status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Outliving the engine (the rig destroys it) is fine too.
  rig.reset();
  EXPECT_EQ(e->Set(absl::OkStatus()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CallerEventTest, AnotherEnginesPendingEventIsRefusedInWaitFor) {
  auto a = MakeRig({});
  auto b = MakeRig({});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  absl::StatusOr<CallerEvent> e = a->engine().CreateEvent();
  ASSERT_TRUE(e.ok());
  std::vector<char> src(16);
  absl::StatusOr<DeviceBuffer> dst = b->engine().Allocate(0, src.size());
  ASSERT_TRUE(dst.ok());
  absl::StatusOr<Event> up = b->engine().TransferToDevice(
      src.data(), *dst, 0, src.size(), {e->event()});
  EXPECT_EQ(up.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(up.status().message(), HasSubstr("another system"));
}

TEST(CallerEventTest, SetFromAnotherThreadWhileManyThreadsWaitOnIt) {
  TransferRig::Params params;
  params.device_url = "sim://?hbm=64M&devices=2";
  auto rig = MakeRig(params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  constexpr int kThreads = 6;
  constexpr int kPerThread = 20;
  const uint64_t n = 12 * kKiB;
  std::atomic<int> failures{0};
  std::atomic<int> submitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<char> src = Pattern(n, t);
      absl::StatusOr<DeviceBuffer> dst = engine.Allocate(t % 2, n);
      if (!dst.ok()) {
        failures.fetch_add(1);
        return;
      }
      std::vector<Event> ups;
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<Event> up =
            engine.TransferToDevice(src.data(), *dst, 0, n, {gate->event()});
        if (!up.ok()) failures.fetch_add(1);
        if (up.ok()) ups.push_back(*up);
        submitted.fetch_add(1);
      }
      // Awaited on this thread while the setter runs on another.
      for (const Event& up : ups) {
        if (!up.Await().ok()) failures.fetch_add(1);
      }
      std::vector<char> back(n);
      absl::StatusOr<Event> down =
          engine.TransferFromDevice(*dst, 0, back.data(), n);
      if (!down.ok() || !down->Await().ok() || back != src) {
        failures.fetch_add(1);
      }
    });
  }
  // Several setters race: exactly one wins.
  std::atomic<int> won{0};
  std::vector<std::thread> setters;
  for (int i = 0; i < 3; ++i) {
    setters.emplace_back([&] {
      while (submitted.load() < kThreads * kPerThread / 2) {
        std::this_thread::yield();
      }
      absl::Status s = gate->Set(absl::OkStatus());
      if (s.ok()) {
        won.fetch_add(1);
      } else if (s.code() != absl::StatusCode::kFailedPrecondition) {
        failures.fetch_add(1);
      }
    });
  }
  for (auto& th : setters) th.join();
  for (auto& th : threads) th.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace tpushim
