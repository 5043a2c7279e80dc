// A System whose region is premapped behind the caller
// (TPUSHIM_PREMAP=background): creation returns before the region is
// populated; transfers meanwhile take the pinned path and arrive intact;
// a pinned host allocation waits for the part it needs (or, asked not to,
// fails at once); progress ends before Create returns unless asked to go
// on, then ends with kDone; the premapping lines come after the
// CreateTpuSystemState ones; destroying the system mid-way leaves nothing
// mapped or locked. (Every injectable call of such a start-up failing in
// turn: fault_sweep_test.cc.)

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "driver/system_internal.h"
#include "env/fault_injection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/log.h"
#include "tests/testing/log_check.h"
#include "tests/testing/scoped_test_logging.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::ScopedTestLogging;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// A fixed environment over the real OS; pre-faulting (each
// MADV_POPULATE_WRITE) waits while the gate is closed, or sleeps.
class GatedOs : public OsWrapper {
 public:
  GatedOs() : OsWrapper(&env_) {}

  std::atomic<bool> gate_closed{false};
  std::atomic<int> sleep_ms{0};
  std::atomic<int> populates{0};

  absl::Status Madvise(void* addr, size_t length, int advice) override {
    if (advice == MADV_POPULATE_WRITE) {
      while (gate_closed.load()) absl::SleepFor(absl::Milliseconds(1));
      if (sleep_ms.load() > 0)
        absl::SleepFor(absl::Milliseconds(sleep_ms.load()));
      ++populates;
    }
    return OsWrapper::Madvise(addr, length, advice);
  }

 private:
  FixedEnvironmentOs env_{Os::Default()};
};

OptionOverrides Background(uint64_t region = 32 * kMiB) {
  OptionOverrides o;
  o.premapped_buffer_size = region;
  o.device = "sim://?devices=2&hbm=64M";
  o.premap = PremapMode::kBackground;
  o.hugepages = HugePagesMode::kOff;  // chunks of region / 8
  o.prefault_threads = 1;
  return o;
}

std::vector<char> Pattern(uint64_t n, int seed) {
  std::vector<char> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 7 + seed);
  return v;
}

// Host -> device 0 -> host, `n` bytes; the data arrive.
void RoundTrip(System& system, uint64_t n, int seed) {
  const std::vector<char> data = Pattern(n, seed);
  absl::StatusOr<DeviceBuffer> b = system.AllocateDevice(0, n);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<char> back(n);
  absl::StatusOr<Event> up = system.TransferToDevice(data.data(), *b, 0, n);
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<Event> down =
      system.TransferFromDevice(*b, 0, back.data(), n, {*up});
  ASSERT_TRUE(down.ok()) << down.status();
  ASSERT_TRUE(down->Await().ok());
  EXPECT_EQ(back, data);
  ASSERT_TRUE(system.Deallocate(*b).ok());
}

TEST(BackgroundSystemTest, CreateReturnsFirstAndTheLinesFollow) {
  ScopedTestLogging logs;
  GatedOs os;
  os.gate_closed = true;
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(Background(), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  // Nothing populated yet, and creation is done.
  EXPECT_EQ(os.populates.load(), 0);
  StartupProgress p = (*system)->premap_progress();
  EXPECT_EQ(p.phase, StartupProgress::Phase::kPremapping);
  EXPECT_EQ(p.done_bytes, 0u);
  EXPECT_EQ(p.total_bytes, 32 * kMiB);
  SystemStats stats = (*system)->GetStats();
  EXPECT_TRUE(stats.region.background);
  EXPECT_FALSE(stats.region.premapped);
  EXPECT_EQ(stats.region.ready_bytes, 0u);
  ASSERT_TRUE(logging::FlushLogs());
  EXPECT_THAT(logs.File("INFO"),
              HasSubstr("CreateTpuSystemState: TPU initialization is "
                        "successful"));

  os.gate_closed = false;
  ASSERT_TRUE((*system)->AwaitPremapped().ok());
  p = (*system)->premap_progress();
  EXPECT_EQ(p.phase, StartupProgress::Phase::kDone);
  EXPECT_EQ(p.done_bytes, 32 * kMiB);
  EXPECT_GT(p.elapsed, (*system)->init_time());
  stats = (*system)->GetStats();
  EXPECT_TRUE(stats.region.premapped);
  EXPECT_EQ(stats.region.ready_bytes, 32 * kMiB);
  EXPECT_EQ(stats.region.premap_error, "");
  ASSERT_TRUE(logging::FlushLogs());
  const std::string info = logs.File("INFO");
  EXPECT_EQ(testutil::StartupLinesProblems(info, {.region_bytes = 32 * kMiB,
                                                  .devices = 2,
                                                  .locked = stats.region.locked,
                                                  .background = true}),
            "");
  // And not in the foreground order.
  EXPECT_NE(
      testutil::StartupLinesProblems(info, {.region_bytes = 32 * kMiB,
                                            .devices = 2,
                                            .locked = stats.region.locked}),
      "");
}

// Locked on fault is locked: right after creation, before any page is
// populated, the region reads locked (tests run as root, with
// CAP_IPC_LOCK), its locked bytes grow with what is premapped, and it
// stays locked once premapped.
TEST(BackgroundSystemTest, RegionIsLockedFromCreateOn) {
  ScopedTestLogging logs;
  GatedOs os;
  os.gate_closed = true;
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(Background(), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  SystemStats stats = (*system)->GetStats();
  EXPECT_FALSE(stats.region.premapped);
  EXPECT_TRUE(stats.region.locked);
  EXPECT_EQ(stats.region.lock_error, "");
  EXPECT_EQ(stats.region.locked_bytes, 0u);

  os.gate_closed = false;
  ASSERT_TRUE((*system)->AwaitPremapped().ok());
  stats = (*system)->GetStats();
  EXPECT_TRUE(stats.region.premapped);
  EXPECT_TRUE(stats.region.locked);
  EXPECT_EQ(stats.region.lock_error, "");
  EXPECT_EQ(stats.region.locked_bytes, 32 * kMiB);
}

TEST(BackgroundSystemTest, TransfersWhilePremappingArePinnedAndArrive) {
  ScopedTestLogging logs;
  GatedOs os;
  os.gate_closed = true;
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(Background(), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  System& s = **system;
  std::vector<char> host(256 * kKiB);
  // Small enough to stage, but staging is not premapped yet.
  EXPECT_EQ(s.PathFor(host.data(), host.size()), TransferPath::kPinned);
  RoundTrip(s, 256 * kKiB, 1);
  RoundTrip(s, 3 * kMiB + 17, 2);
  const TransferStats t = s.GetStats().transfers;
  EXPECT_EQ(t.pinned_not_premapped, 4u);
  EXPECT_EQ(t.pinned_over_threshold, 0u);
  ASSERT_TRUE(logging::FlushLogs());
  EXPECT_THAT(logs.File("WARNING"),
              HasSubstr("pins the caller's memory for the transfer (slower): "
                        "staging space is not premapped yet (0B of the 32.00M "
                        "region premapped so far, TPUSHIM_PREMAP="
                        "background)."));

  // A pinned host buffer waits for its part of the region.
  std::atomic<bool> allocated{false};
  std::thread waiter([&] {
    absl::StatusOr<PinnedHostBuffer> b = s.AllocatePinnedHost(kMiB);
    ASSERT_TRUE(b.ok()) << b.status();
    allocated = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(allocated.load());
  os.gate_closed = false;
  waiter.join();
  ASSERT_TRUE(s.AwaitPremapped().ok());
  EXPECT_EQ(s.GetStats().region.ready_waits, 1u);
  // Counted, not timed: the waiter may begin waiting after the 50 ms above
  // began, so its wait can be shorter than that on a loaded machine.
  EXPECT_GT(s.GetStats().region.ready_wait_time, absl::ZeroDuration());

  // Premapped: staged again.
  EXPECT_EQ(s.PathFor(host.data(), host.size()), TransferPath::kStaged);
  RoundTrip(s, 256 * kKiB, 3);
  EXPECT_EQ(s.GetStats().transfers.pinned_not_premapped, 4u);
}

TEST(BackgroundSystemTest, TransfersRaceThePremappingFromSeveralThreads) {
  ScopedTestLogging logs;
  GatedOs os;
  os.sleep_ms = 2;
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(Background(64 * kMiB), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        RoundTrip(**system, (64 + 37 * i) * kKiB, t * 20 + i);
        absl::StatusOr<PinnedHostBuffer> b =
            (*system)->AllocatePinnedHost(kMiB);
        ASSERT_TRUE(b.ok()) << b.status();
        std::memset(b->data(), t, kMiB);
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE((*system)->AwaitPremapped().ok());
  const SystemStats stats = (*system)->GetStats();
  EXPECT_EQ(stats.region.live_allocations, 0u);
  for (const auto& direction : stats.transfers.host) {
    for (const PathStats& path : direction) EXPECT_EQ(path.failed, 0u);
  }
  // Some went pinned while staging was not premapped, unless premapping
  // won every race; all of them arrived (RoundTrip).
  EXPECT_GT(stats.transfers.host[0][2].transfers +
                stats.transfers.host[0][1].transfers,
            0u);
}

TEST(BackgroundSystemTest,
     ProgressAskedToGoOnGoesOnAfterCreateAndEndsWithDone) {
  ScopedTestLogging logs;
  GatedOs os;
  os.gate_closed = true;
  std::vector<StartupProgress> seen;
  std::atomic<bool> done{false};
  absl::StatusOr<std::unique_ptr<System>> system = SystemFactory::Create(
      Background(), &os, nullptr,
      [&](const StartupProgress& p) {
        seen.push_back(p);
        if (p.phase == StartupProgress::Phase::kDone) done = true;
      },
      StartupProgressUntil::kPremapped);
  ASSERT_TRUE(system.ok()) << system.status();
  EXPECT_FALSE(done.load());
  os.gate_closed = false;
  ASSERT_TRUE((*system)->AwaitPremapped().ok());
  system->reset();  // the callback has returned for good
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen.front().phase, StartupProgress::Phase::kPremapping);
  EXPECT_EQ(seen.front().done_bytes, 0u);
  EXPECT_EQ(seen.back().phase, StartupProgress::Phase::kDone);
  EXPECT_EQ(seen.back().done_bytes, 32 * kMiB);
  EXPECT_EQ(seen.back().total_bytes, 32 * kMiB);
  EXPECT_TRUE(seen.back().complete());
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_GE(seen[i].done_bytes, seen[i - 1].done_bytes);
  }
  EXPECT_EQ(std::count_if(seen.begin(), seen.end(),
                          [](const StartupProgress& p) {
                            return p.phase == StartupProgress::Phase::kDone;
                          }),
            1);
}

// By default the callback lives only as long as Create: its last call,
// kDone with what is premapped so far, comes before Create returns, and
// none after (it may use the caller's locals), however long premapping
// goes on and even when the system is destroyed mid-way.
TEST(BackgroundSystemTest, ProgressNotAskedToGoOnEndsBeforeCreateReturns) {
  ScopedTestLogging logs;
  GatedOs os;
  os.gate_closed = true;
  std::atomic<bool> returned{false};
  std::atomic<int> after_return{0};
  std::vector<StartupProgress> seen;
  absl::StatusOr<std::unique_ptr<System>> system = SystemFactory::Create(
      Background(), &os, nullptr, [&](const StartupProgress& p) {
        if (returned.load()) ++after_return;
        seen.push_back(p);
      });
  returned = true;
  // A failed ASSERT below must not leave the system's destruction stuck
  // behind the gate.
  absl::Cleanup open_gate = [&os] { os.gate_closed = false; };
  ASSERT_TRUE(system.ok()) << system.status();
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen.back().phase, StartupProgress::Phase::kDone);
  EXPECT_EQ(seen.back().done_bytes, 0u);  // nothing populated yet
  EXPECT_EQ(seen.back().total_bytes, 32 * kMiB);
  EXPECT_FALSE(seen.back().complete());
  // premap_progress still tells the truth.
  EXPECT_EQ((*system)->premap_progress().phase,
            StartupProgress::Phase::kPremapping);
  os.gate_closed = false;
  ASSERT_TRUE((*system)->AwaitPremapped().ok());
  EXPECT_TRUE((*system)->premap_progress().complete());
  system->reset();
  EXPECT_EQ(after_return.load(), 0);

  // Destroyed mid-way: no call either.
  os.gate_closed = true;
  returned = false;
  system = SystemFactory::Create(Background(), &os, nullptr,
                                 [&](const StartupProgress&) {
                                   if (returned.load()) ++after_return;
                                 });
  returned = true;
  ASSERT_TRUE(system.ok()) << system.status();
  os.gate_closed = false;
  system->reset();
  EXPECT_EQ(after_return.load(), 0);
}

// The non-blocking form: UNAVAILABLE at once where AllocatePinnedHost
// would wait for premapping; both serve what is premapped.
TEST(BackgroundSystemTest, NoWaitAllocationIsUnavailableUntilPremapped) {
  ScopedTestLogging logs;
  GatedOs os;
  os.gate_closed = true;
  absl::StatusOr<std::unique_ptr<System>> system =
      SystemFactory::Create(Background(), &os);
  absl::Cleanup open_gate = [&os] { os.gate_closed = false; };
  ASSERT_TRUE(system.ok()) << system.status();
  absl::StatusOr<PinnedHostBuffer> b =
      (*system)->AllocatePinnedHost(kMiB, 64, PremapWait::kNoWait);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
  EXPECT_THAT(b.status().message(), HasSubstr("not premapped yet (0 of "));
  // More than the region: RESOURCE_EXHAUSTED at once either way.
  b = (*system)->AllocatePinnedHost(33 * kMiB, 64, PremapWait::kNoWait);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  b = (*system)->AllocatePinnedHost(33 * kMiB);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  os.gate_closed = false;
  ASSERT_TRUE((*system)->AwaitPremapped().ok());
  b = (*system)->AllocatePinnedHost(kMiB, 64, PremapWait::kNoWait);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*system)->GetStats().region.ready_waits, 0u);
}

TEST(BackgroundSystemTest, DestroyedWhilePremappingLeavesNothingBehind) {
  ScopedTestLogging logs;
  GatedOs gated;
  gated.sleep_ms = 20;
  FaultInjector injector;
  FaultInjectingOs os(&gated, &injector);
  for (int round = 0; round < 3; ++round) {
    std::optional<StartupProgress> last;
    absl::StatusOr<std::unique_ptr<System>> system = SystemFactory::Create(
        Background(64 * kMiB), &os, &injector,
        [&](const StartupProgress& p) { last = p; },
        StartupProgressUntil::kPremapped);
    ASSERT_TRUE(system.ok()) << system.status();
    absl::SleepFor(absl::Milliseconds(10 * round));
    RoundTrip(**system, 128 * kKiB, round);
    system->reset();
    ASSERT_TRUE(last.has_value());
    EXPECT_EQ(last->phase, StartupProgress::Phase::kDone);
    EXPECT_LT(last->done_bytes, 64 * kMiB);
    EXPECT_FALSE(last->complete());
    EXPECT_EQ(os.mapped_bytes(), 0u);
    EXPECT_EQ(os.locked_bytes(), 0u);
    EXPECT_EQ(os.pinned_bytes(), 0u);
  }
  ASSERT_TRUE(logging::FlushLogs());
  EXPECT_THAT(logs.File("INFO"),
              HasSubstr("bytes: the system is being destroyed"));
}

}  // namespace
}  // namespace tpushim
