// tpushim::System: start-up in libtpu's order, the public API end to end,
// several systems in one process. Failures at every injectable call of
// start-up, transfers and teardown: fault_sweep_test.cc.

#include "tpushim/system.h"

#include <regex.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "driver/system_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"
#include "tests/testing/temp_dir.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::ScopedTestLogging;

constexpr uint64_t kMiB = uint64_t{1} << 20;

OptionOverrides Small(uint64_t region = 8 * kMiB,
                      std::string device = "sim://?devices=2&hbm=32M") {
  OptionOverrides o;
  o.premapped_buffer_size = region;
  o.device = std::move(device);
  o.prefault_threads = 1;
  return o;
}

void ExpectInOrder(const std::string& text,
                   const std::vector<std::string>& expected) {
  size_t at = 0;
  for (const std::string& e : expected) {
    const size_t found = text.find(e, at);
    ASSERT_NE(found, std::string::npos)
        << "missing (in order): " << e << "\nlog:\n"
        << text;
    at = found + e.size();
  }
}

// Start-up progress: the region populated in order, 0 to all of it, then
// kDone; and kDone with what was done when start-up fails.
TEST(SystemTest, ReportsStartupProgress) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  std::vector<StartupProgress> seen;
  auto system = SystemFactory::Create(
      Small(32 * kMiB), &os, nullptr,
      [&seen](const StartupProgress& p) { seen.push_back(p); });
  ASSERT_TRUE(system.ok()) << system.status();
  ASSERT_GE(seen.size(), 3u);
  // At most about 20 a second, besides the first, the last byte and kDone.
  EXPECT_LE(seen.size(),
            3 + 20 * absl::ToDoubleSeconds(seen.back().elapsed) + 1);
  EXPECT_EQ(seen.front().phase, StartupProgress::Phase::kPremapping);
  EXPECT_EQ(seen.front().done_bytes, 0u);
  EXPECT_EQ(seen[seen.size() - 2].done_bytes, 32 * kMiB);
  EXPECT_EQ(seen.back().phase, StartupProgress::Phase::kDone);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].total_bytes, 32 * kMiB);
    if (i > 0) {
      EXPECT_GE(seen[i].done_bytes, seen[i - 1].done_bytes);
      EXPECT_GE(seen[i].elapsed, seen[i - 1].elapsed);
    }
    if (i + 1 < seen.size()) {
      EXPECT_EQ(seen[i].phase, StartupProgress::Phase::kPremapping);
    }
  }

  seen.clear();
  OptionOverrides bad = Small();
  bad.device = "sim://?devices=0";
  EXPECT_FALSE(SystemFactory::Create(
                   bad, &os, nullptr,
                   [&seen](const StartupProgress& p) { seen.push_back(p); })
                   .ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().phase, StartupProgress::Phase::kDone);
}

TEST(SystemTest, LogsTheStartupLinesInLibtpuOrder) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  auto system = SystemFactory::Create(Small(), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  const std::string info = logs.File("INFO");
  ExpectInOrder(info,
                {"] TPU premapped buffer enabled. Size: 8388608 Threshold: "
                 "8388608\n",
                 "] Creating numa aware allocators, number of NUMA nodes ",
                 "] Starting premapped memory manager initialization...\n",
                 "] Premapped buffer is using alignment 64\n",
                 "] mlock()-ed 8388608 bytes for premapped region, using 1 "
                 "syscalls.\n",
                 "] Done premapping memory of size 8388608 in ",
                 "] Done allocating premapped memory of size 8388608\n",
                 "] tpu::System initialized, current host id: 0, logical "
                 "device ids: 0,1\n",
                 "] CreateTpuSystemState: TPU initialization is successful "
                 "and it took ",
                 "] CreateTpuSystemState: using TPU host premapped buffer of "
                 "size: 8388608\n"});
  // Nine decimals, as libtpu prints them.
  regex_t re;
  ASSERT_EQ(regcomp(&re, "and it took [0-9]+\\.[0-9]{9}s\n", REG_EXTENDED), 0);
  EXPECT_EQ(regexec(&re, info.c_str(), 0, nullptr, 0), 0) << info;
  regfree(&re);
  EXPECT_GT((*system)->init_time(), absl::ZeroDuration());
  EXPECT_EQ((*system)->device_count(), 2);
  EXPECT_EQ((*system)->device(1).name, "sim:1");
  EXPECT_EQ((*system)->premapped_bytes(), 8 * kMiB);
  EXPECT_EQ((*system)->transfer_threshold_bytes(), 8 * kMiB);
}

TEST(SystemTest, LogsEverySettingWithItsSourceOnceBeforeTheStartupLines) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default(), {{"TPUSHIM_LOG_KEEP", "7"}});
  auto system = SystemFactory::Create(Small(), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  const std::string info = logs.File("INFO");
  // The resolved value of every setting and its source, logged once.
  ExpectInOrder(
      info, {"] tpushim configuration: "
             "TPU_PREMAPPED_BUFFER_SIZE=8388608 (api), ",
             "TPUSHIM_LOG_KEEP=7 (env), ", "TPUSHIM_HUGEPAGES=auto (default), ",
             "] TPU premapped buffer enabled. Size: 8388608"});
  size_t lines = 0;
  for (size_t at = info.find("] tpushim configuration: ");
       at != std::string::npos;
       at = info.find("] tpushim configuration: ", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u);
}

TEST(SystemTest, RoundTripThroughPinnedHostAndPageableMemory) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  auto system = SystemFactory::Create(Small(), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  System& s = **system;
  const uint64_t n = 3 * kMiB + 17;
  auto pinned = s.AllocatePinnedHost(n);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  for (uint64_t i = 0; i < n; ++i) {
    static_cast<char*>(pinned->data())[i] = static_cast<char>(i * 7);
  }
  EXPECT_EQ(s.PathFor(pinned->data(), n), TransferPath::kZeroCopy);
  auto a = s.AllocateDevice(0, n);
  auto b = s.AllocateDevice(1, n);
  ASSERT_TRUE(a.ok() && b.ok());
  auto up = s.TransferToDevice(pinned->data(), *a, 0, n);
  ASSERT_TRUE(up.ok());
  auto copy = s.TransferDeviceToDevice(*a, 0, *b, 0, n, {*up});
  ASSERT_TRUE(copy.ok());
  std::vector<char> back(n);
  auto down = s.TransferFromDevice(*b, 0, back.data(), n, {*copy});
  ASSERT_TRUE(down.ok());
  ASSERT_TRUE(down->Await().ok()) << down->Await();
  EXPECT_EQ(std::memcmp(back.data(), pinned->data(), n), 0);

  const SystemStats stats = s.GetStats();
  EXPECT_TRUE(stats.region.enabled);
  EXPECT_GE(stats.region.bytes_in_use, n);
  EXPECT_EQ(stats.region.live_allocations, 1u);
  ASSERT_EQ(stats.devices.size(), 2u);
  EXPECT_GE(stats.devices[0].hbm_in_use, n);
  EXPECT_EQ(stats.transfers.host[0][0].transfers, 1u);  // h2d zero-copy
  EXPECT_EQ(stats.transfers.host[1][1].transfers, 1u);  // d2h staged
  EXPECT_EQ(stats.transfers.device_to_device.transfers, 1u);

  pinned->Reset();
  EXPECT_EQ(s.GetStats().region.live_allocations, 0u);
  auto freed = s.Deallocate(*a);
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(freed->Await().ok());
}

TEST(SystemTest, PinnedHostAllocationFailsWithLibtpuText) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  auto system = SystemFactory::Create(Small(8 * kMiB), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  auto held = (*system)->AllocatePinnedHost(2 * kMiB - 460 * 1024);
  ASSERT_TRUE(held.ok());
  auto big = (*system)->AllocatePinnedHost(8 * kMiB);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(big.status().message()),
              HasSubstr("Attempting to allocate 8.00M. That was not possible. "
                        "There are 6.45M free."));
  EXPECT_THAT(logs.File("ERROR"),
              HasSubstr("Allocating buffer from premapped region failed with: "
                        "RESOURCE_EXHAUSTED: Attempting to allocate 8.00M."));
}

TEST(SystemTest, PinnedHostWithRegionOffIsFailedPrecondition) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  auto system = SystemFactory::Create(Small(0), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  EXPECT_EQ((*system)->AllocatePinnedHost(4096).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(logs.File("INFO"), HasSubstr("] TPU premapped buffer disabled."));
  EXPECT_FALSE((*system)->GetStats().region.enabled);
}

// The profile is created right after the devices open, before the region:
// a path that cannot be created is the error, not what premapping a region
// the host cannot hold (1 TiB here) would have said after the slow part.
TEST(SystemTest, AMemoryProfileThatCannotBeCreatedFailsBeforePremapping) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  OptionOverrides o = Small(uint64_t{1} << 40);
  o.memory_profile = "/nonexistent-tpushim-dir/p.jsonl";
  auto system = SystemFactory::Create(o, &os);
  ASSERT_FALSE(system.ok());
  EXPECT_TRUE(absl::IsNotFound(system.status())) << system.status();
  EXPECT_THAT(system.status().message(),
              HasSubstr("TPUSHIM_MEMORY_PROFILE=/nonexistent-tpushim-dir/"
                        "p.jsonl: cannot create the file"));
}

TEST(SystemTest, TwoSystemsLiveSideBySide) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  // One chip each of a simulated host of two: a System owns its chips.
  OptionOverrides first = Small(4 * kMiB, "sim://?devices=2&hbm=16M");
  first.visible_chips = std::vector<int>{0};
  OptionOverrides second = first;
  second.visible_chips = std::vector<int>{1};
  auto one = SystemFactory::Create(first, &os);
  auto two = SystemFactory::Create(second, &os);
  ASSERT_TRUE(one.ok() && two.ok());
  auto a = (*one)->AllocateDevice(0, 4096);
  ASSERT_TRUE(a.ok());
  // A buffer of one system is foreign to the other.
  std::vector<char> host(4096, 1);
  EXPECT_EQ((*two)->TransferToDevice(host.data(), *a, 0, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto up = (*one)->TransferToDevice(host.data(), *a, 0, 4096);
  ASSERT_TRUE(up.ok());
  EXPECT_TRUE(up->Await().ok());
  one->reset();
  auto b = (*two)->AllocateDevice(0, 4096);
  EXPECT_TRUE(b.ok());
}

TEST(SystemTest, PendingEventOfAnotherSystemIsRefusedInWaitFor) {
  // Its continuation would call into this system after it may be gone.
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  // One chip each of a simulated host of two.
  OptionOverrides slow_chip =
      Small(4 * kMiB, "sim://?devices=2&hbm=16M&latency_us=200000");
  slow_chip.visible_chips = std::vector<int>{0};
  OptionOverrides other_chip = Small(4 * kMiB, "sim://?devices=2&hbm=16M");
  other_chip.visible_chips = std::vector<int>{1};
  auto slow = SystemFactory::Create(slow_chip, &os);
  auto other = SystemFactory::Create(other_chip, &os);
  ASSERT_TRUE(slow.ok() && other.ok());
  std::vector<char> host(4096, 1);
  auto a = (*slow)->AllocateDevice(0, 4096);
  auto b = (*other)->AllocateDevice(0, 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  auto pending = (*slow)->TransferToDevice(host.data(), *a, 0, 4096);
  ASSERT_TRUE(pending.ok());
  ASSERT_FALSE(pending->IsReady());
  auto refused =
      (*other)->TransferToDevice(host.data(), *b, 0, 4096, {*pending});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("another system"));
  EXPECT_EQ((*other)->Deallocate(*b, {*pending}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Once ready, it is an ordinary (ready) dependency.
  ASSERT_TRUE(pending->Await().ok());
  auto accepted =
      (*other)->TransferToDevice(host.data(), *b, 0, 4096, {*pending});
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE(accepted->Await().ok());
}

// Model time that crawls: a thousandth of real time.
class SlowClockOs : public FixedEnvironmentOs {
 public:
  using FixedEnvironmentOs::FixedEnvironmentOs;
  int64_t MonotonicNanos() override {
    return FixedEnvironmentOs::MonotonicNanos() / 1000;
  }
};

// A device being torn down does not sleep out model time: destroying a
// system with a transfer held by 10 s of modelled latency returns at once
// and the transfer has finished. Here those 10 s are almost three hours of
// real time, so without that the test hangs until ctest's timeout.
TEST(SystemTest, DestroyDoesNotWaitOutModelledLatency) {
  ScopedTestLogging logs;
  SlowClockOs os(Os::Default());
  auto system = SystemFactory::Create(
      Small(0, "sim://?hbm=16M&latency_us=10000000"), &os);
  ASSERT_TRUE(system.ok()) << system.status();
  std::vector<char> host(4096, 1);
  auto a = (*system)->AllocateDevice(0, 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  auto pending = (*system)->TransferToDevice(host.data(), *a, 0, 4096);
  ASSERT_TRUE(pending.ok()) << pending.status();
  EXPECT_FALSE(pending->IsReady());
  system->reset();
  ASSERT_TRUE(pending->IsReady());
  // Finished; or cancelled, had it not started yet.
  const absl::Status done = pending->Await();
  EXPECT_TRUE(done.ok() || absl::IsCancelled(done)) << done;
}

TEST(SystemTest, LogOpenFaultsReachTheLogFiles) {
  // TPUSHIM_FAULTS=log_open:... must fail log file creation like EACCES
  // would: logging falls back (a WARNING on stderr), the system starts.
  logging::ShutdownLogging();
  testutil::TempDir dir;
  FixedEnvironmentOs os(Os::Default());
  OptionOverrides o = Small();
  o.faults = "log_open:every=1";
  o.log_dir = dir.path();
  o.stderr_log_level = 3;
  auto system = SystemFactory::Create(o, &os);
  ASSERT_TRUE(system.ok()) << system.status();
  LOG(INFO) << "a line for the INFO file";
  EXPECT_TRUE(logging::FlushLogs());
  EXPECT_GT(logging::FileWriteErrorCount(), 0u);
  EXPECT_EQ(testutil::ReadFileOrEmpty(dir.Join("tpu_driver.INFO")), "");
  system->reset();
  logging::ShutdownLogging();
}

TEST(SystemTest, MalformedSettingIsInvalidArgumentNamingIt) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  OptionOverrides o = Small();
  o.device = "sim://?devices=0";
  auto system = SystemFactory::Create(o, &os);
  ASSERT_FALSE(system.ok());
  EXPECT_EQ(system.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(system.status().message()), HasSubstr("devices"));
}

}  // namespace
}  // namespace tpushim
